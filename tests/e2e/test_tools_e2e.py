"""Tool calling with the `openai` client through the live embedded platform (demo model with
random weights and the platform's default template, Hermes format): a required or named call
always parses against the function's schema, plain and streamed; `none` never calls; and an
agent loop (call -> tool result -> answer) runs to its end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.openai_helpers import deployed, openai_client

pytestmark = pytest.mark.e2e

MODEL = "tools"
# small: the demo model's context is 512 tokens, and the tools are part of the prompt
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Oslo", "Lima"]}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 4}},
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def oai(platform: dict[str, Any], demo_model: Path) -> openai.OpenAI:
    return openai_client(deployed(platform, demo_model, MODEL))


def _valid(call: Any) -> None:
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_and_named_calls_parse_against_their_schemas(oai: openai.OpenAI) -> None:
    for seed in range(3):
        resp = oai.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0,
            seed=seed, max_tokens=120, parallel_tool_calls=False,
        )  # fmt: skip
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        _valid(call)
    named = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120, temperature=1.0, seed=7,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    calls = named.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_time"]
    _valid(calls[0])
    # none: the tools are offered to the template, never called
    plain = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason in ("stop", "length")


def test_a_streamed_call_arrives_as_tool_call_deltas(oai: openai.OpenAI) -> None:
    args, name, finish = "", None, None
    for chunk in oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
        max_tokens=120, stream=True, parallel_tool_calls=False,
    ):  # fmt: skip
        for c in chunk.choices:
            for delta in c.delta.tool_calls or []:
                name = delta.function.name if delta.function and delta.function.name else name
                args += delta.function.arguments or "" if delta.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and name in SCHEMAS
    jsonschema.validate(json.loads(args), SCHEMAS[name])


def test_an_agent_loop_runs_to_its_answer(oai: openai.OpenAI) -> None:
    messages: Any = list(ASK)
    first = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=120,
        parallel_tool_calls=False,
    )  # fmt: skip
    call = (first.choices[0].message.tool_calls or [])[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'})
    second = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=12
    )
    assert second.choices[0].message.content
    assert second.usage is not None and first.usage is not None
    # the history (the call and its result) was part of the prompt
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_bad_tool_requests_name_the_parameter(oai: openai.OpenAI) -> None:
    unknown = {"type": "function", "function": {"name": "nope"}}
    bad_name = [{"type": "function", "function": {"name": "bad name!"}}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": unknown}, "tool_choice"),
        ({"tools": bad_name}, "tools[0].function.name"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **extra)
        assert refused.value.param == param, (extra, refused.value)


def _flat(tools: Any) -> Any:
    """The Responses API's tool shape (the function's fields at the top)."""
    return [{"type": "function", **t["function"]} for t in tools]


def test_the_responses_api_calls_functions_and_takes_their_outputs(oai: openai.OpenAI) -> None:
    first = oai.responses.create(
        model=MODEL, input="What is the weather in Oslo?", tools=_flat(TOOLS),
        tool_choice="required", parallel_tool_calls=False, max_output_tokens=120,
    )  # fmt: skip
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and first.status == "completed"
    call = calls[0]
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    named = oai.responses.create(
        model=MODEL, input="Time?", tools=_flat(TOOLS), max_output_tokens=120,
        tool_choice={"type": "function", "name": "get_time"},
    )  # fmt: skip
    assert [i.name for i in named.output if i.type == "function_call"] == ["get_time"]
    # the call and its output go back as input; the answer is text
    history: Any = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 3}'},
    ]  # fmt: skip
    answer = oai.responses.create(
        model=MODEL, input=history, tools=_flat(TOOLS), tool_choice="none", max_output_tokens=8
    )
    assert answer.output_text and answer.usage is not None and first.usage is not None
    assert answer.usage.input_tokens > first.usage.input_tokens
    # streamed: the call arrives as its item and argument events
    with oai.responses.stream(
        model=MODEL, input="Weather?", tools=_flat(TOOLS), tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=120,
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    streamed = [i for i in final.output if i.type == "function_call"]
    assert len(streamed) == 1
    jsonschema.validate(json.loads(streamed[0].arguments), SCHEMAS[streamed[0].name])

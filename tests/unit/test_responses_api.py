"""The Responses API's request: every parameter of OpenAI's reference is honoured or refused by
name, an "off" value is never refused, and the input becomes the chat it stands for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import response_create_params

from control_plane.api.openai_requests import refusal
from control_plane.api.responses_api import RESPONSES_PARAMETERS, ResponsesRequest
from control_plane.errors import InvalidRequest

# OpenAI's reference for POST /v1/responses, typed here independently: each parameter with a
# value a client would send that asks for something (not the parameter's "off" value), and
# whether this platform honours it.
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
REFERENCE: dict[str, tuple[Any, bool]] = {
    "model": ("demo", True),
    "input": ("Hi", True),
    "instructions": ("Be brief.", True),
    "max_output_tokens": (16, True),
    "temperature": (0.5, True),
    "top_p": (0.9, True),
    "stream": (True, True),
    "stream_options": ({"include_obfuscation": False}, True),
    "text": ({"format": {"type": "json_object"}}, True),
    "top_logprobs": (2, True),
    "include": (["message.output_text.logprobs"], True),
    "user": ("user-1", True),
    "safety_identifier": ("user-1", True),
    "metadata": ({"purpose": "test"}, True),
    "prompt_cache_key": ("k1", True),
    "prompt_cache_retention": ("24h", True),
    "max_tool_calls": (3, True),
    "service_tier": ("flex", False),
    "truncation": ("auto", False),
    "store": (True, False),
    "previous_response_id": ("resp_1", False),
    "conversation": ("conv_1", False),
    "background": (True, False),
    "background_options": ({"completion_window": "2h"}, False),
    "tools": ([TOOL], True),
    "tool_choice": ("auto", True),
    "parallel_tool_calls": (True, True),
    "reasoning": ({"effort": "low"}, False),
    "prompt": ({"id": "pmpt_1"}, False),
    "context_management": ([{"type": "compaction"}], False),
    "prompt_cache_options": ({"mode": "explicit"}, False),
    "access_programs": ({"cyber": "standard"}, False),
    "image": ({"context_compression": "enabled"}, False),
    "moderation": ({"model": "omni-moderation-latest"}, False),
}
# Values that ask for nothing: never refused.
OFF: dict[str, Any] = {
    "store": False,
    "background": False,
    "tools": [],
    "tool_choice": "none",
    "parallel_tool_calls": False,
    "reasoning": {"effort": None, "summary": None},
    "truncation": "disabled",
    "service_tier": "auto",
    "include": ["reasoning.encrypted_content"],
    "previous_response_id": None,
    "conversation": None,
    "context_management": [],
}


def test_the_table_lists_the_reference_and_the_installed_client_s_parameters() -> None:
    assert set(RESPONSES_PARAMETERS) == set(REFERENCE)
    # what the installed `openai` sends from client.responses.create(...)
    sent = set(response_create_params.ResponseCreateParamsBase.__annotations__) | {"stream"}
    assert sent <= set(RESPONSES_PARAMETERS), sent - set(RESPONSES_PARAMETERS)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_every_reference_parameter_is_honoured_or_refused_by_name(name: str) -> None:
    value, honoured = REFERENCE[name]
    why = refusal(RESPONSES_PARAMETERS, name, value)
    assert (why is None) is honoured, (name, why)
    body = {"model": "demo", "input": "Hi", name: value}
    if honoured:
        ResponsesRequest.model_validate(body).checked()
        return
    assert why is not None and why.startswith(f"'{name}'")
    with pytest.raises(InvalidRequest) as info:
        ResponsesRequest.model_validate(body).checked()
    assert info.value.extra == {"param": name, "code": "unsupported_parameter"}


@pytest.mark.parametrize(("name", "value"), sorted(OFF.items()))
def test_off_values_are_never_refused(name: str, value: Any) -> None:
    ResponsesRequest.model_validate({"model": "demo", "input": "Hi", name: value}).checked()


def test_an_unknown_parameter_and_an_unknown_include_are_named() -> None:
    with pytest.raises(InvalidRequest) as unknown:
        ResponsesRequest.model_validate({"model": "d", "input": "x", "frobnicate": 1}).checked()
    assert unknown.value.extra == {"param": "frobnicate", "code": "unknown_parameter"}
    assert str(unknown.value) == "Unrecognized request argument supplied: frobnicate"
    body = {"model": "d", "input": "x", "include": ["file_search_call.results"]}
    with pytest.raises(InvalidRequest) as include:
        ResponsesRequest.model_validate(body).checked()
    assert include.value.extra["param"] == "include"
    assert "file_search_call.results" in str(include.value)


def messages(**body: Any) -> list[tuple[str, str]]:
    request = ResponsesRequest.model_validate({"model": "demo", **body}).checked()
    return [(m["role"], m["content"]) for m in request.messages()]


def test_input_becomes_the_chat_it_stands_for() -> None:
    assert messages(input="Hi") == [("user", "Hi")]
    assert messages(input="Hi", instructions="Be brief.") == [
        ("system", "Be brief."),
        ("user", "Hi"),
    ]
    earlier_output = {
        "type": "message",
        "id": "msg_1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello.", "annotations": [], "logprobs": []}],
    }
    items = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi, "},
                                     {"type": "input_text", "text": "there"}]},
        earlier_output,
        {"type": "message", "role": "user", "content": "And now?"},
    ]  # fmt: skip
    assert messages(input=items, instructions="Be brief.") == [
        ("system", "Be brief."),
        ("developer", "Answer in French."),
        ("user", "Hi, there"),
        ("assistant", "Hello."),
        ("user", "And now?"),
    ]


@pytest.mark.parametrize(
    ("items", "param", "code"),
    [
        ([], "input", "empty_array"),
        ([{"type": "file_search_call", "id": "c"}], "input[0].type", "invalid_value"),
        ([{"type": "function_call_output", "call_id": "c"}], "input[0]",
         "missing_required_parameter"),
        ([{"type": "function_call", "name": "f"}], "input[0]", "missing_required_parameter"),
        ([{"role": "tool", "content": "1"}], "input[0].role", "invalid_value"),
        ([{"role": "user"}], "input[0].content", "missing_required_parameter"),
        ([{"role": "user", "content": "a"},
          {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/i.png"}]}],
         "input[1].content[0].type", "invalid_value"),
        ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text",
         "missing_required_parameter"),
    ],
)  # fmt: skip
def test_input_that_is_not_text_messages_is_refused_by_name(
    items: list[dict[str, Any]], param: str, code: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        ResponsesRequest.model_validate({"model": "demo", "input": items}).checked()
    assert info.value.extra.get("param") == param
    assert info.value.extra.get("code", "invalid_value") == code
    assert param in str(info.value)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_text_format_becomes_structured_output() -> None:
    def structured(fmt: Any) -> Any:
        body = {"model": "d", "input": "x", "text": {"format": fmt}}
        return ResponsesRequest.model_validate(body).checked().structured()

    assert structured(None) is None
    assert structured({"type": "text"}) is None
    assert structured({"type": "json_object"}).kind == "json"
    # name and schema sit in the format itself (chat wraps them in `json_schema`)
    spec = structured({"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True})
    assert (spec.kind, json.loads(spec.value)) == ("json", SCHEMA)


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ({"format": {"type": "json_schema", "name": "x"}}, "text.format.schema"),
        ({"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}, "text.format"),
        ({"format": {"type": "grammar"}}, "text.format"),
        ({"format": "json"}, "text.format"),
        ({"verbosity": "low"}, "text.verbosity"),
        ({"colour": "blue"}, "text.colour"),
    ],
)
def test_a_text_config_that_cannot_be_served_is_refused_by_name(
    text: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        ResponsesRequest.model_validate({"model": "d", "input": "x", "text": text}).structured()
    assert info.value.extra["param"] == param


def test_the_job_input_and_what_the_response_repeats() -> None:
    body = {
        "model": "demo",
        "input": "Hi",
        "max_output_tokens": 7,
        "temperature": 0.2,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 3,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}},
        "metadata": {"k": "v"},
    }
    request = ResponsesRequest.model_validate(body).checked()
    chat = request.chat_request()
    job_input = request.job_input(chat, "<rendered>", False, request.structured())
    assert (job_input.prompt, job_input.max_tokens, job_input.temperature) == ("<rendered>", 7, 0.2)
    assert (job_input.logprobs, job_input.add_special_tokens) == (3, False)
    assert job_input.structured == {"json": SCHEMA}
    echoed = request.echoed()
    assert echoed["text"]["format"]["schema"] == SCHEMA
    assert (echoed["metadata"], echoed["top_logprobs"], echoed["store"]) == ({"k": "v"}, 3, False)
    # OpenAI's defaults, which the job uses too
    plain = ResponsesRequest(model="demo", input="Hi").checked()
    assert plain.logprobs_asked() is None
    assert plain.job_input(plain.chat_request(), "p", True, None).temperature == 1.0
    assert (plain.echoed()["temperature"], plain.echoed()["top_p"]) == (1.0, 1.0)
    assert plain.echoed()["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    # top_logprobs alone asks for no log-probabilities, as on OpenAI
    alone = ResponsesRequest(model="demo", input="Hi", top_logprobs=2).checked()
    assert alone.logprobs_asked() is None


def test_function_calls_and_their_outputs_become_tool_turns() -> None:
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        {"type": "function_call_output", "call_id": "c2", "output": "4"},
    ]
    messages = ResponsesRequest.model_validate({"model": "demo", "input": items}).messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]  # one turn, two calls
    assert (messages[2]["tool_call_id"], messages[2]["content"]) == ("c1", "3")
    chat = ResponsesRequest.model_validate(
        {"model": "demo", "input": items, "tools": [TOOL], "tool_choice": "required"}
    ).chat_request()
    assert chat.tool_mode() == "required" and chat.tools is not None

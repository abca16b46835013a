"""OpenAI's Responses API (`POST /v1/responses`) through the live embedded platform (real
worker, demo model with random weights) with the official `openai` client: plain, with
instructions, a message list holding an earlier answer, streamed (`create(stream=True)` and
`responses.stream`), structured (`text.format` and `responses.parse`), with log-probabilities;
the prompt is the one chat renders for the same messages, and refusals name themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.e2e.openai_helpers import deployed, openai_client

pytestmark = pytest.mark.e2e

MODEL = "responses"
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
    },
    "required": ["kind", "legs"],
    "additionalProperties": False,
}


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    legs: int


@pytest.fixture(scope="module")
def api(platform: dict[str, Any], demo_model: Path) -> dict[str, Any]:
    return deployed(platform, demo_model, MODEL)


@pytest.fixture(scope="module")
def oai(api: dict[str, Any]) -> openai.OpenAI:
    return openai_client(api)


def _job(api: dict[str, Any], job_id: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api['api_key']}"}
    job: dict[str, Any] = httpx.get(f"{api['url']}/v1/jobs/{job_id}", headers=headers).json()
    return job


def _chat_prompt(api: dict[str, Any], oai: openai.OpenAI, messages: Any) -> tuple[str, str]:
    """The prompt chat renders for `messages`, and its greedy text (8 tokens)."""
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0
    )
    text = raw.parse().choices[0].message.content or ""
    return _job(api, raw.headers["X-Job-Id"])["input"]["prompt"], text


def test_plain_with_instructions_as_chat_renders_it(
    api: dict[str, Any], oai: openai.OpenAI
) -> None:
    raw = oai.responses.with_raw_response.create(
        model=MODEL, input="Tell me about the weather.", instructions="Be brief.",
        max_output_tokens=8, temperature=0,
    )  # fmt: skip
    resp = raw.parse()
    job_id = raw.headers["X-Job-Id"]
    assert resp.id == f"resp_{job_id}" and resp.object == "response" and resp.model == MODEL
    assert resp.status in ("completed", "incomplete"), resp.status
    if resp.status == "incomplete":  # random weights rarely end on their own
        assert resp.incomplete_details and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and 0 < resp.usage.output_tokens <= 8
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.instructions == "Be brief." and resp.temperature == 0
    messages: Any = [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Tell me about the weather."}]  # fmt: skip
    prompt, text = _chat_prompt(api, oai, messages)
    job = _job(api, job_id)
    assert job["input"]["prompt"] == prompt
    assert job["input"]["max_tokens"] == 8
    assert resp.output_text == text  # greedy: the same text as chat's


def test_a_message_list_with_an_earlier_answer(api: dict[str, Any], oai: openai.OpenAI) -> None:
    first = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=4, temperature=0)
    history: Any = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        *[item.model_dump() for item in first.output],  # sent back as OpenAI's docs show
        {"type": "message", "role": "user", "content": "And the weather?"},
    ]
    raw = oai.responses.with_raw_response.create(
        model=MODEL, input=history, max_output_tokens=4, temperature=0
    )
    messages: Any = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the weather?"},
    ]
    prompt, _ = _chat_prompt(api, oai, messages)
    assert _job(api, raw.headers["X-Job-Id"])["input"]["prompt"] == prompt
    assert raw.parse().output_text


def test_streamed_events_parse_and_add_up(oai: openai.OpenAI) -> None:
    plain = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=12, temperature=0)
    events = list(
        oai.responses.create(
            model=MODEL, input="Hi", max_output_tokens=12, temperature=0, stream=True
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:4]] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
    ]  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e for e in events if e.type == "response.output_text.done"]
    last = events[-1]
    assert last.type == f"response.{plain.status}"
    assert deltas == done[0].text == last.response.output_text == plain.output_text  # type: ignore[union-attr]
    assert last.response.usage == plain.usage  # type: ignore[union-attr]


def test_json_schema_output_validates_plain_streamed_and_parsed(oai: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "pet", "schema": SCHEMA, "strict": True}
    for seed_temperature in (0.0, 1.0):
        resp = oai.responses.create(
            model=MODEL, input="Describe a pet as JSON.", max_output_tokens=200,
            temperature=seed_temperature, text={"format": fmt},
        )  # fmt: skip
        assert resp.status == "completed", resp.incomplete_details
        jsonschema.validate(json.loads(resp.output_text), SCHEMA)
    # the client's own helpers: a pydantic model as the format, streamed and not
    parsed = oai.responses.parse(
        model=MODEL, input="Describe a pet as JSON.", max_output_tokens=200, text_format=Pet
    )
    assert isinstance(parsed.output_parsed, Pet)
    with oai.responses.stream(
        model=MODEL, input="Describe a pet as JSON.", max_output_tokens=200, text_format=Pet
    ) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Pet)
    assert streamed == final.output_text
    assert final.text is not None and final.text.format is not None
    assert final.text.format.type == "json_schema"


def test_log_probabilities_when_included(oai: openai.OpenAI) -> None:
    resp = oai.responses.create(
        model=MODEL, input="Hi", max_output_tokens=6, temperature=0, top_logprobs=2,
        include=["message.output_text.logprobs"],
    )  # fmt: skip
    part = resp.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs is not None
    assert resp.usage is not None and len(part.logprobs) == resp.usage.output_tokens
    for t in part.logprobs:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].token == t.token  # greedy: the most likely token


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("store", True),
        ("previous_response_id", "resp_1"),
        ("tools", [{"type": "web_search"}]),
        ("reasoning", {"effort": "low"}),
        ("background", True),
        ("truncation", "auto"),
    ],
)
def test_refused_parameters_name_themselves(oai: openai.OpenAI, name: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model=MODEL, input="Hi", max_output_tokens=2, **{name: value})
    expected = "tools[0].type" if name == "tools" else name  # only function tools are served
    assert (info.value.param, info.value.code) == (expected, "unsupported_parameter")
    assert name in info.value.message


def test_bad_input_unknown_parameters_and_missing_models(oai: openai.OpenAI) -> None:
    image: Any = [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
    with pytest.raises(openai.BadRequestError) as bad:
        oai.responses.create(model=MODEL, input=image, max_output_tokens=2)
    assert bad.value.param == "input[0].content[0].type"
    with pytest.raises(openai.BadRequestError) as unknown:
        oai.responses.create(
            model=MODEL, input="Hi", max_output_tokens=2, extra_body={"frobnicate": 1}
        )
    assert (unknown.value.param, unknown.value.code) == ("frobnicate", "unknown_parameter")
    with pytest.raises(openai.NotFoundError) as missing:
        oai.responses.create(model="no-such-model", input="Hi", max_output_tokens=2)
    assert missing.value.code == "model_not_found"
    # the prompt cannot fit the context: the input is at fault
    with pytest.raises(openai.BadRequestError) as long:
        oai.responses.create(model=MODEL, input="weather " * 1000, max_output_tokens=2)
    assert (long.value.param, long.value.code) == ("input", "context_length_exceeded")

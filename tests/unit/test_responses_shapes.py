"""The Responses API's answer and stream events, checked against the `openai` client's own
models (validated strictly, as pydantic reads them): a response object whose `output_text`
works, and events that parse as `ResponseStreamEvent`s whose deltas add up to the text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from control_plane.api import responses_shapes as shapes
from control_plane.api.responses_api import ResponsesRequest

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
ENTRY = {"token": "Hi", "bytes": [72, 105], "logprob": -0.5,
         "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5}]}  # fmt: skip


def job(text: str, finish: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    output: dict[str, Any] = {"text": text, "finish_reason": finish, "cached_tokens": 2}
    if logprobs is not None:
        output["logprobs"] = logprobs
    return {"status": "succeeded", "output": output,
            "usage": {"prompt_tokens": 5, "generated_tokens": 3}}  # fmt: skip


def start(**body: Any) -> dict[str, Any]:
    request = ResponsesRequest.model_validate({"model": "demo", "input": "Hi", **body})
    return shapes.opened("j1", 1_700_000_000, request.checked().echoed())


def test_a_finished_job_is_a_response_the_client_reads() -> None:
    body = shapes.finished(start(instructions="Be brief."), "j1", job("Hello", "stop"), None, 7)
    resp = Response.model_validate(body)
    assert (resp.id, resp.object, resp.status, resp.model) == ("resp_j1", "response",
                                                               "completed", "demo")  # fmt: skip
    assert resp.output_text == "Hello" and resp.incomplete_details is None
    (item,) = resp.output
    assert (item.type, item.id, item.status) == ("message", "msg_j1", "completed")
    assert resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (5, 3, 8)
    assert resp.usage.input_tokens_details.cached_tokens == 2
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert (resp.instructions, resp.tools, resp.error) == ("Be brief.", [], None)
    assert resp.completed_at == 7


def test_a_job_that_stopped_at_the_limit_is_incomplete() -> None:
    body = shapes.finished(start(max_output_tokens=3), "j1", job("a b c", "length"), None, 7)
    resp = Response.model_validate(body)
    assert resp.status == "incomplete" and resp.output_text == "a b c"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete"  # type: ignore[union-attr]


def test_log_probabilities_when_asked() -> None:
    asked = start(include=["message.output_text.logprobs"], top_logprobs=1)
    body = shapes.finished(asked, "j1", job("Hi", "stop", [ENTRY]), 1, 7)
    part = Response.model_validate(body).output[0].content[0]  # type: ignore[union-attr]
    assert part.logprobs is not None and part.logprobs[0].token == "Hi"  # type: ignore[union-attr]
    plain = shapes.finished(start(), "j1", job("Hi", "stop", [ENTRY]), None, 7)
    assert plain["output"][0]["content"][0]["logprobs"] == []


def parsed(lines: list[str]) -> list[Any]:
    """Each event parsed as the client parses it; its `event:` line names its `type`."""
    events = []
    for line in lines:
        head, data, blank = line.split("\n", 2)
        assert head.startswith("event: ") and data.startswith("data: ") and blank == "\n"
        event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")))
        assert event.type == head.removeprefix("event: ")
        events.append(event)
    return events


@pytest.mark.parametrize(("finish", "last"), [("stop", "completed"), ("length", "incomplete")])
def test_a_stream_s_events_parse_and_add_up(finish: str, last: str) -> None:
    out, begun = shapes.EventStream("j1"), start()
    lines = out.opening(begun)
    lines += [out.delta("Hel", None, None), out.delta("lo", None, None)]
    lines += out.closing(shapes.finished(begun, "j1", job("Hello", finish), None, 7))
    events = parsed(lines)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", f"response.{last}",
    ]  # fmt: skip
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all((e.item_id, e.output_index, e.content_index) == ("msg_j1", 0, 0) for e in deltas)
    assert "".join(e.delta for e in deltas) == events[6].text == "Hello"
    assert events[-1].response.output_text == "Hello"
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_a_stream_that_fails_says_so_and_names_the_job() -> None:
    out, begun = shapes.EventStream("j1"), start()
    events = parsed(out.opening(begun) + out.failing(begun, "the job ended failed: boom",
                                                     "job_failed"))  # fmt: skip
    error, failed = events[-2:]
    assert (error.type, error.code) == ("error", "job_failed")
    assert error.message == "job j1: the job ended failed: boom"
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.message == error.message

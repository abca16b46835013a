"""OpenAI's response object and stream events (`POST /v1/responses`) built from a job: the
shapes `openai`'s `Response` and `ResponseStreamEvent` models read, so that a client's
`resp.output_text` and `client.responses.stream(...)` work unchanged.

A response holds one output item, the assistant's message, with one `output_text` part. A job
that stopped at `max_output_tokens` is `incomplete` (`incomplete_details.reason`), as OpenAI's;
one that ended without a result is `failed` (streamed only: a call that waits answers OpenAI's
error object instead).

Example:

    >>> job = {"output": {"text": "Hi", "finish_reason": "stop"},
    ...        "usage": {"prompt_tokens": 3, "generated_tokens": 1}}
    >>> r = finished(opened("j1", 0, {}), "j1", job, None, 1)
    >>> r["status"], r["output"][0]["content"][0]["text"], r["usage"]["total_tokens"]
    ('completed', 'Hi', 4)
"""

from __future__ import annotations

import json
from typing import Any

from control_plane.api import openai_shapes
from control_plane.api.openai_tools import answer_calls
from control_plane.api.tool_calls import parse


def response_id(job_id: str) -> str:
    return f"resp_{job_id}"


def message_id(job_id: str) -> str:
    return f"msg_{job_id}"


def opened(job_id: str, created_at: int, echoed: dict[str, Any]) -> dict[str, Any]:
    """The response as it starts: `in_progress`, no output yet; `echoed` holds the request's
    settings (`ResponsesRequest.echoed`)."""
    return {
        "id": response_id(job_id),
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        **echoed,
        "output": [],
        "usage": None,
        "completed_at": None,
    }


def usage(job: dict[str, Any]) -> dict[str, Any]:
    counts = openai_shapes.usage(job)
    cached = (job.get("output") or {}).get("cached_tokens")
    return {
        "input_tokens": counts["prompt_tokens"],
        # prompt tokens found in the prefix cache; no explicit cache writes are offered
        # (`prompt_cache_options` is refused), so none are counted
        "input_tokens_details": {
            "cached_tokens": cached if isinstance(cached, int) else 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }


def logprobs(entries: list[dict[str, Any]] | None, top: int | None) -> list[dict[str, Any]]:
    """Per-token entries in OpenAI's shape (empty when none were asked for)."""
    if top is None:
        return []
    content: list[dict[str, Any]] = openai_shapes.chat_logprobs(entries or [], top)["content"]
    return content


def text_part(text: str, entries: list[dict[str, Any]] | None, top: int | None) -> dict[str, Any]:
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": logprobs(entries, top),
    }


def message(job_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": message_id(job_id),
        "status": status,
        "role": "assistant",
        "content": content,
    }


def function_call(call: dict[str, Any]) -> dict[str, Any]:
    """A `function_call` output item from chat's tool call (`openai_tools.answer_calls`)."""
    return {
        "type": "function_call",
        "id": "fc_" + call["id"].removeprefix("call_"),
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


def _ended(
    job_id: str, job: dict[str, Any], top: int | None, parser: str | None, keep_message: bool
) -> tuple[str, list[dict[str, Any]]]:
    """The status of a job that succeeded, and its output items: the message (left out when
    the answer is only function calls, unless `keep_message`), then the calls."""
    (choice,) = openai_shapes.choices(job)[:1]
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    text, calls = choice["text"], []
    if parser is not None:
        content, parsed = parse(parser, text)
        if parsed:
            text, calls = content or "", answer_calls(parsed, job_id, 0)
    items = [function_call(call) for call in calls]
    if keep_message or text or not calls:
        part = text_part(text, choice["logprobs"], top)
        items.insert(0, message(job_id, status, [part]))
    return status, items


def finished(
    start: dict[str, Any],
    job_id: str,
    job: dict[str, Any],
    top: int | None,
    completed_at: int,
    parser: str | None = None,
    keep_message: bool = False,
) -> dict[str, Any]:
    """The response of job `job_id`, which succeeded (`start`: `opened`'s object); `parser`:
    the deployment's tool-call format when the call let the model call its tools."""
    status, items = _ended(job_id, job, top, parser, keep_message)
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        **start,
        "status": status,
        "incomplete_details": incomplete,
        "output": items,
        "usage": usage(job),
        "completed_at": completed_at,
    }


def failed(start: dict[str, Any], message_text: str) -> dict[str, Any]:
    # `server_error`: the one code of OpenAI's `ResponseError` for a failure on its side
    return {**start, "status": "failed", "error": {"code": "server_error", "message": message_text}}


class EventStream:
    """Server-sent events as OpenAI sends them: `event: <type>` and `data: <json>` holding the
    same `type` and the stream's `sequence_number` (0, 1, 2, ...). Item and part events name
    the one message (`output_index` 0, `content_index` 0)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.item_id = message_id(job_id)
        self.sequence_number = 0

    def event(self, type_: str, **fields: Any) -> str:
        data = {"type": type_, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {type_}\ndata: {json.dumps(data)}\n\n"

    def opening(self, start: dict[str, Any]) -> list[str]:
        """`response.created` and `in_progress`; the message and its text part added."""
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        return [
            self.event("response.created", response=start),
            self.event("response.in_progress", response=start),
            self.event(
                "response.output_item.added",
                output_index=0,
                item=message(self.job_id, "in_progress", []),
            ),
            self.event("response.content_part.added", **where, part=text_part("", None, None)),
        ]

    def delta(self, text: str, entries: list[dict[str, Any]] | None, top: int | None) -> str:
        return self.event(
            "response.output_text.delta",
            item_id=self.item_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=logprobs(entries, top),
        )

    def closing(self, end: dict[str, Any]) -> list[str]:
        """The text, part and item done; each function call added, its arguments, done; then
        `response.completed` (or `incomplete`). `end`: `finished`'s object, its message first."""
        item = end["output"][0]
        part = item["content"][0]
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        lines = [
            self.event(
                "response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"]
            ),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=0, item=item),
        ]
        for index, call in enumerate(end["output"][1:], start=1):
            at = {"item_id": call["id"], "output_index": index}
            lines += [
                self.event("response.output_item.added", output_index=index,
                           item={**call, "arguments": "", "status": "in_progress"}),
                self.event("response.function_call_arguments.delta", **at,
                           delta=call["arguments"]),
                self.event("response.function_call_arguments.done", **at,
                           arguments=call["arguments"], name=call["name"]),
                self.event("response.output_item.done", output_index=index, item=call),
            ]  # fmt: skip
        return [*lines, self.event(f"response.{end['status']}", response=end)]

    def failing(self, start: dict[str, Any], message_text: str, code: str) -> list[str]:
        """An `error` event with the platform's code (`job_failed`, `job_restarted`, ...),
        then `response.failed`. Both name the job (so does `X-Job-Id`)."""
        text = f"job {self.job_id}: {message_text}"
        return [
            self.event("error", code=code, message=text, param=None),
            self.event("response.failed", response=failed(start, text)),
        ]

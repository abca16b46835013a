"""A scripted platform for the SDK's unit tests: an httpx.MockTransport handler that answers from a
script and records what it was sent, a clock that moves only when the client sleeps, and the
answers the platform gives (jobs, problem+json, event streams)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx

BASE = "http://platform.test"
KEY = "sk_test_123"

Answer = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class Server:
    """A MockTransport handler answering from a script, recording every request it gets."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert self.answers, f"unexpected request {request.method} {request.url}"
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(request)
        return answer

    def body(self, i: int) -> Any:
        return json.loads(self.requests[i].content)

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


class FakeTime:
    """Monotonic clock that only moves when the client sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Chunks(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body in pieces, for either client; then `error`, if given, is raised (the
    connection drops mid-body)."""

    def __init__(self, chunks: list[bytes], error: Exception | None = None) -> None:
        self.chunks = chunks
        self.error = error

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.error is not None:
            raise self.error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error


def job(job_id: str = "job_1", status: str = "succeeded", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": job_id, "deployment": "demo", "status": status, "attempt": 1}
    if status == "succeeded":
        body["output"] = {"text": "Hello there", "finish_reason": "stop"}
    body.update(fields)
    return body


def answer(status: int, body: Any = None, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def problem(status: int, title: str, detail: str = "", **extra: Any) -> httpx.Response:
    body = {"type": f"https://platform.dev/problems/{status}", "title": title, "status": status}
    body.update(detail=detail, **extra)
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


def sse(*events: tuple[str, dict[str, Any]], job_id: str = "job_1") -> httpx.Response:
    text = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    return httpx.Response(
        200,
        content=text.encode(),
        headers={"content-type": "text/event-stream", "X-Job-Id": job_id},
    )

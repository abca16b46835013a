"""SDK clients against httpx.MockTransport: requests, errors, polling, SSE, retries, config.

Every test that talks to the platform runs twice, over `Client` and over `AsyncClient` (the
`twin` fixture): the async one is driven through `Blocking`, which runs each coroutine it
returns to the end, so one test body holds both to the same behaviour.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import httpx
import pytest

import sdk
from sdk import (
    APIConnectionError,
    APIError,
    AsyncBatch,
    AsyncClient,
    AsyncJob,
    AuthenticationError,
    Batch,
    Client,
    ConflictError,
    Deployment,
    InvalidRequestError,
    Job,
    JobFailed,
    JobTimeout,
    ModelError,
    NotFoundError,
    PlatformError,
    RateLimitError,
    ServerError,
)
from sdk._async_batches import AsyncBatchResults
from sdk._async_jobs import AsyncStream
from sdk._async_resource import AsyncResource
from sdk._base import RetryPolicy, backoff_s, parse_retry_after, poll_interval_s
from sdk._config import Credentials, write_config
from sdk._models import BatchView, JobView
from sdk._sse import RunStatus, SSEDecoder

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


# --- both clients, one test body ------------------------------------------------------------

# What Blocking wraps: the async SDK objects with coroutine methods or async iteration.
ASYNC_TYPES = (AsyncClient, AsyncResource, AsyncJob, AsyncStream, AsyncBatch, AsyncBatchResults)
# Blocking names whose async counterpart is spelled differently.
ASYNC_NAMES = {"close": "aclose"}


class Blocking:
    """A blocking view of an async SDK object: every coroutine it returns is run to its end on
    the test's event loop, `for`/`next` and `with` map onto `async for` and `async with`, and
    what comes back (a job, a stream, a resource) is viewed the same way.

    NOTE: `isinstance(view, AsyncJob)` holds, as for the object itself (`__class__`).
    """

    def __init__(self, target: Any, runner: asyncio.Runner) -> None:
        self._target = target
        self._runner = runner

    @property
    def __class__(self) -> type:
        return type(self._target)

    def _await(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            value = self._runner.run(value)
        if isinstance(value, list):
            return [self._await(item) for item in value]
        return Blocking(value, self._runner) if isinstance(value, ASYNC_TYPES) else value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, ASYNC_NAMES.get(name, name))
        if not inspect.ismethod(value):
            return self._await(value)
        return lambda *args, **kwargs: self._await(value(*args, **kwargs))

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return self._await(self._target.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> Any:
        return self._await(self._target.__aenter__())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._await(self._target.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        return repr(self._target)


class AsyncOver(httpx.AsyncBaseTransport):
    """A sync transport (a test double) offered to AsyncClient: each request is handled inline."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)


@dataclass(frozen=True)
class Twin:
    """One of the two clients, as the tests drive it."""

    name: str  # "sync" or "async": the test id
    Job: type[JobView]  # what a run with wait=False returns
    Batch: type[BatchView]  # what batches.create returns
    runner: asyncio.Runner | None = None  # the async client's event loop, one per test

    def client(
        self,
        *args: Any,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
        **kwargs: Any,
    ) -> Client:
        """`Client(*args, ...)`, or the same AsyncClient behind a Blocking view (typed as
        Client: it answers as one); a sync `transport` or `sleep` is adapted for it."""
        if self.runner is None:
            if sleep is not None:
                kwargs["sleep"] = sleep
            return Client(*args, transport=transport, **kwargs)
        if sleep is not None:
            blocking_sleep = sleep

            async def async_sleep(seconds: float) -> None:
                blocking_sleep(seconds)

            kwargs["sleep"] = async_sleep
        async_transport: httpx.AsyncBaseTransport | None = None
        if isinstance(transport, httpx.AsyncBaseTransport):
            async_transport = transport  # MockTransport serves both clients
        elif transport is not None:
            async_transport = AsyncOver(transport)
        client = AsyncClient(*args, transport=async_transport, **kwargs)
        return cast(Client, Blocking(client, self.runner))


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest) -> Iterator[Twin]:
    if request.param == "sync":
        yield Twin("sync", Job, Batch)
        return
    with asyncio.Runner() as runner:
        yield Twin("async", AsyncJob, AsyncBatch, runner)


MakeClient = Callable[..., Client]


@pytest.fixture
def make_client(twin: Twin) -> MakeClient:
    """`make_client(server, fake_time, **options)`: the twin against a scripted Server."""

    def make(server: Server, fake_time: FakeTime, **kwargs: Any) -> Client:
        return twin.client(
            BASE,
            KEY,
            transport=httpx.MockTransport(server),
            sleep=fake_time.sleep,
            clock=fake_time.clock,
            rand=lambda: 0.5,
            **kwargs,
        )

    return make


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


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PLATFORM_URL", raising=False)
    monkeypatch.delenv("PLATFORM_API_KEY", raising=False)
    monkeypatch.setenv("PLATFORM_CONFIG", str(tmp_path / "absent.json"))


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


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


# --- request building and config ------------------------------------------------------------


def test_run_builds_the_documented_request_and_returns_the_text(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(answer(200, job(), **{"X-Job-Id": "job_1"}))
    with make_client(server, fake_time) as client:
        text = client.run("demo", {"prompt": "Hi", "max_tokens": 16})

    assert text == "Hello there"
    [request] = server.requests
    assert request.method == "POST"
    assert str(request.url) == f"{BASE}/v1/deployments/demo/run"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    uuid.UUID(request.headers["idempotency-key"])  # a fresh uuid4 per call
    body = server.body(0)
    assert body["input"] == {"prompt": "Hi", "max_tokens": 16}
    assert body["stream"] is False
    # The server holds a sync run for less than the 30 s HTTP timeout, then answers 202.
    assert 0 < body["wait_s"] < 30
    assert request.extensions["timeout"]["read"] == 30.0


def test_a_bare_string_input_is_the_prompt(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(answer(200, job()))
    make_client(server, fake_time).run("demo", "Hi")
    assert server.body(0)["input"] == {"prompt": "Hi"}


def test_names_are_percent_encoded_into_one_path_segment(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(answer(200, job()))
    make_client(server, fake_time).jobs.get("job/../x")
    assert server.requests[0].url.raw_path == b"/v1/jobs/job%2F..%2Fx"


def test_config_precedence_args_env_file_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, twin: Twin
) -> None:
    def seen(*args: str) -> tuple[str, str | None]:
        server = Server(answer(200, {"data": []}))
        twin.client(*args, transport=httpx.MockTransport(server)).workers.list()
        request = server.requests[0]
        url = str(request.url.copy_with(query=None))
        return url.removesuffix("/v1/workers"), request.headers.get("authorization")

    assert seen() == ("http://127.0.0.1:8000", None)

    config = tmp_path / "config.json"
    write_config(config, "http://from-file:1", "key-file")
    assert config.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("PLATFORM_CONFIG", str(config))
    assert seen() == ("http://from-file:1", "Bearer key-file")

    monkeypatch.setenv("PLATFORM_URL", "http://from-env:2/")
    assert seen() == ("http://from-env:2", "Bearer key-file")
    monkeypatch.setenv("PLATFORM_API_KEY", "key-env")
    assert seen() == ("http://from-env:2", "Bearer key-env")

    assert seen("http://explicit:3", "key-arg") == ("http://explicit:3", "Bearer key-arg")


def test_a_broken_config_file_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, twin: Twin
) -> None:
    config = tmp_path / "config.json"
    config.write_text("{not json")
    monkeypatch.setenv("PLATFORM_CONFIG", str(config))
    with pytest.raises(PlatformError, match="not valid JSON"):
        twin.client()


def test_a_url_without_a_scheme_is_refused(monkeypatch: pytest.MonkeyPatch, twin: Twin) -> None:
    with pytest.raises(PlatformError, match=r"'localhost:8000' \(from the base_url argument\)"):
        twin.client("localhost:8000")
    monkeypatch.setenv("PLATFORM_URL", "ftp://x")
    with pytest.raises(PlatformError, match="PLATFORM_URL"):
        twin.client()


def test_max_retries_below_zero_is_refused(twin: Twin) -> None:
    with pytest.raises(ValueError, match="max_retries"):
        twin.client(BASE, KEY, max_retries=-1)
    with pytest.raises(ValueError, match="max_unavailable_s"):
        twin.client(BASE, KEY, max_unavailable_s=-1)


def test_credentials_repr_hides_the_key() -> None:
    assert KEY not in repr(Credentials(BASE, KEY))


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, InvalidRequestError),
        (401, AuthenticationError),
        (403, AuthenticationError),
        (404, NotFoundError),
        (409, ConflictError),
        (413, InvalidRequestError),
        (422, InvalidRequestError),
        (429, RateLimitError),
        (500, ServerError),
        (418, APIError),
    ],
)
def test_problem_json_maps_to_the_error_class(
    status: int, error_class: type[APIError], fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(problem(status, "Nope", "deployment 'x' does not exist"))
    client = make_client(server, fake_time, max_retries=0)
    with pytest.raises(error_class) as caught:
        client.deployments.get("x")
    error = caught.value
    assert type(error) is error_class
    assert error.status == status
    assert error.title == "Nope"
    assert error.detail == "deployment 'x' does not exist"
    assert error.type == f"https://platform.dev/problems/{status}"
    assert error.problem["status"] == status
    assert "deployment 'x' does not exist" in str(error)


def test_validation_errors_and_the_job_id_header(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    errors = [{"field": "input.max_tokens", "message": "must be <= 4096"}]
    response = problem(422, "Unprocessable Entity", "invalid input", errors=errors)
    response.headers["X-Job-Id"] = "job_9"
    client = make_client(Server(response), fake_time)
    with pytest.raises(InvalidRequestError) as caught:
        client.run("demo", {"prompt": "Hi", "max_tokens": 10**6})
    assert caught.value.errors == errors
    assert caught.value.job_id == "job_9"


def test_an_error_that_is_not_json_keeps_its_text(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    html = httpx.Response(502, text="<html>bad gateway</html>")
    client = make_client(Server(html, html, html, html), fake_time, max_unavailable_s=0)
    with pytest.raises(ServerError) as caught:
        client.jobs.get("job_1")
    assert caught.value.status == 502
    assert caught.value.title == "Bad Gateway"
    assert "bad gateway" in caught.value.detail


# --- sync runs: polling and job failures ----------------------------------------------------


def test_a_202_is_polled_until_the_job_ends(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(202, job(status="queued"), **{"X-Job-Id": "job_1"}),
        answer(200, job(status="starting", status_reason="no_capacity")),
        answer(200, job(status="running")),
        answer(200, job()),
    )
    assert make_client(server, fake_time).run("demo", {"prompt": "Hi"}) == "Hello there"
    assert server.paths() == ["POST /v1/deployments/demo/run"] + ["GET /v1/jobs/job_1"] * 3
    assert fake_time.sleeps == [poll_interval_s(0), poll_interval_s(1), poll_interval_s(2)]


def test_the_job_id_comes_from_the_header_when_the_body_has_none(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    body = job(status="running")
    del body["id"]
    server = Server(answer(202, body, **{"X-Job-Id": "job_7"}), answer(200, job("job_7")))
    assert make_client(server, fake_time).run("demo", "Hi") == "Hello there"
    assert server.requests[1].url.path == "/v1/jobs/job_7"


def test_a_run_that_outlives_its_timeout_raises_job_timeout(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    running = answer(200, job(status="running"))
    server = Server(answer(202, job(status="running")), *[running] * 50)
    with pytest.raises(JobTimeout) as caught:
        make_client(server, fake_time).run("demo", "Hi", timeout=3.0)
    assert caught.value.job_id == "job_1"
    assert caught.value.timeout_s == 3.0
    assert fake_time.now == pytest.approx(3.0)
    assert server.body(0)["wait_s"] == 3.0  # never asks the server to hold it longer


@pytest.mark.parametrize(
    ("status", "error_type", "error_class"),
    [
        ("failed", "model_error", ModelError),
        ("failed", "invalid_input", ModelError),
        ("failed", "worker_lost", JobFailed),
        ("timed_out", "execution_timeout", JobFailed),
        ("canceled", None, JobFailed),
        ("expired", None, JobFailed),
    ],
)
def test_a_job_that_ends_badly_raises(
    status: str,
    error_type: str | None,
    error_class: type[JobFailed],
    fake_time: FakeTime,
    make_client: MakeClient,
) -> None:
    error = {"type": error_type, "message": "boom"} if error_type else None
    server = Server(answer(200, job(status=status, error=error)))
    with pytest.raises(JobFailed) as caught:
        make_client(server, fake_time).run("demo", "Hi")
    assert type(caught.value) is error_class
    assert caught.value.job_id == "job_1"
    assert caught.value.status == status
    assert caught.value.job.status == status


def test_wait_false_returns_the_job_unpolled(
    fake_time: FakeTime, make_client: MakeClient, twin: Twin
) -> None:
    server = Server(answer(202, job(status="queued")))
    result = make_client(server, fake_time).run("demo", "Hi", wait=False)
    assert isinstance(result, twin.Job)
    assert (result.id, result.status) == ("job_1", "queued")
    assert len(server.requests) == 1


def test_a_failing_poll_still_names_its_job(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(answer(202, job(status="running")), problem(500, "Internal Server Error"))
    client = make_client(server, fake_time, max_retries=0)
    with pytest.raises(ServerError) as caught:
        client.run("demo", "Hi")
    assert caught.value.job_id == "job_1"


# --- streaming ------------------------------------------------------------------------------


def test_sse_decoder_frames_events_per_the_spec() -> None:
    decoder = SSEDecoder()
    lines = [
        ": keep-alive",
        "",
        "event: output",
        "id: 1",
        'data: {"delta":',
        'data:  "x"}',
        "retry: 100",
        "",
        "data: no event name",
        "",
        "event: ignored-without-data",
        "",
    ]
    events = [e for e in map(decoder.feed, lines) if e is not None]
    assert [(e.event, e.data, e.id) for e in events] == [
        ("output", '{"delta":\n "x"}', "1"),
        ("message", "no event name", "1"),
    ]


def test_stream_yields_text_deltas_until_completed(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        sse(
            ("queued", {"job_id": "job_1"}),
            ("starting", {"reason": "no_capacity"}),
            ("running", {"attempt": 1, "worker_id": "wrk_1"}),
            ("output", {"delta": "Hello"}),
            ("output", {"delta": " there"}),
            ("completed", job()),
        )
    )
    stream = make_client(server, fake_time).run("demo", {"prompt": "Hi"}, stream=True)
    assert stream.job_id == "job_1"
    assert list(stream) == ["Hello", " there"]
    assert stream.job is not None and stream.job.status == "succeeded"
    assert server.body(0) == {"input": {"prompt": "Hi"}, "stream": True}
    assert server.requests[0].headers["accept"] == "text/event-stream"


def test_a_stream_reports_the_cold_start_before_the_text(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    loading = {"reason": "loading_weights", "phase": "loading_weights", "eta_s": 3.5}
    server = Server(
        sse(
            ("queued", {"job_id": "job_1"}),
            ("starting", {"reason": "no_capacity", "phase": "booting", "eta_s": None}),
            ("starting", {**loading, "bytes_done": 250, "bytes_total": 1000}),
            ("starting", {"reason": "warming", "phase": "warming", "eta_s": 0.2}),
            ("running", {"attempt": 1, "worker_id": "wrk_1"}),
            ("output", {"delta": "Hello"}),
            ("completed", job()),
        )
    )
    seen: list[RunStatus] = []
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True, on_status=seen.append)
    assert list(stream) == ["Hello"]
    assert [(s.status, s.phase) for s in seen] == [
        ("queued", None),
        ("starting", "booting"),
        ("starting", "loading_weights"),
        ("starting", "warming"),
        ("running", None),
    ]
    assert seen[2] == RunStatus("starting", "loading_weights", "loading_weights", 3.5, 250, 1000)
    assert seen[1].eta_s is None and seen[1].reason == "no_capacity"
    assert stream.status == seen[-1]


def test_stream_handles_crlf_and_chunks_split_anywhere(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    text = (
        'event: output\r\ndata: {"delta": "a"}\r\n\r\n'
        'event: output\r\ndata: {"delta": "b"}\r\n\r\n'
        f"event: completed\r\ndata: {json.dumps(job())}\r\n\r\n"
    ).encode()
    chunks = [text[i : i + 7] for i in range(0, len(text), 7)]
    response = httpx.Response(200, stream=Chunks(chunks), headers={"X-Job-Id": "job_1"})
    stream = make_client(Server(response), fake_time).run("demo", "Hi", stream=True)
    assert list(stream) == ["a", "b"]


def test_a_failed_stream_raises_after_the_deltas(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    failed = job(status="failed", error={"type": "model_error", "message": "nan logits"})
    server = Server(sse(("output", {"delta": "Hel"}), ("failed", failed)))
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert next(stream) == "Hel"
    with pytest.raises(ModelError) as caught:
        next(stream)
    assert caught.value.job_id == "job_1"


def test_a_canceled_event_raises_job_failed(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(sse(("canceled", {"id": "job_1", "status": "canceled"})))
    with pytest.raises(JobFailed) as caught:
        list(make_client(server, fake_time).run("demo", "Hi", stream=True))
    assert caught.value.status == "canceled"


@pytest.mark.parametrize("status", ["expired", "timed_out"])
def test_expired_and_timed_out_events_end_the_stream_with_their_status(
    fake_time: FakeTime, make_client: MakeClient, status: str
) -> None:
    server = Server(sse(("output", {"delta": "He"}), (status, {"id": "job_1"})))
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert next(stream) == "He"
    with pytest.raises(JobFailed) as caught:
        next(stream)
    assert caught.value.status == status
    assert server.paths()[1:] == [], "a terminal event needs no poll"


def test_a_stream_that_breaks_off_is_finished_by_polling(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        sse(("output", {"delta": "Hello"})),  # ends without a terminal event
        answer(200, job(status="running")),
        answer(200, job()),
    )
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert list(stream) == ["Hello", " there"]  # the rest of the stored output
    assert server.paths()[1:] == ["GET /v1/jobs/job_1"] * 2


def sse_cut(*events: tuple[str, dict[str, Any]], job_id: str | None = "job_1") -> httpx.Response:
    """A run stream whose connection drops after `events`: the body raises ReadError."""
    text = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    headers = {"content-type": "text/event-stream"}
    if job_id is not None:
        headers["X-Job-Id"] = job_id
    error = httpx.ReadError("connection reset by peer")
    return httpx.Response(200, stream=Chunks([text.encode()], error), headers=headers)


def test_a_stream_whose_connection_drops_is_resumed_by_its_job_id(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        sse_cut(("queued", {"job_id": "job_1"}), ("output", {"delta": "Hel"})),
        answer(200, job(status="running")),
        answer(200, job()),
    )
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert list(stream) == ["Hel", "lo there"]  # the text the stream still owed
    assert stream.job is not None and stream.job.status == "succeeded"
    # The run itself is never sent again: the job is read by the id X-Job-Id gave.
    assert server.paths() == ["POST /v1/deployments/demo/run"] + ["GET /v1/jobs/job_1"] * 2
    assert fake_time.sleeps == [poll_interval_s(0)]


def test_a_dropped_stream_learns_its_job_from_the_queued_event(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        sse_cut(("queued", {"job_id": "job_4"}), job_id=None), answer(200, job("job_4"))
    )
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert list(stream) == ["Hello there"]
    assert server.paths()[1:] == ["GET /v1/jobs/job_4"]


def test_a_resumed_stream_raises_when_the_job_failed(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    failed = job(status="failed", error={"type": "model_error", "message": "nan logits"})
    server = Server(sse_cut(("output", {"delta": "Hel"})), answer(200, failed))
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert next(stream) == "Hel"
    with pytest.raises(ModelError) as caught:
        next(stream)
    assert caught.value.job_id == "job_1"


def test_a_resumed_stream_is_bounded_by_the_run_timeout(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    running = answer(200, job(status="running"))
    server = Server(sse_cut(("output", {"delta": "Hel"})), *[running] * 50)
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True, timeout=2.0)
    assert next(stream) == "Hel"
    with pytest.raises(JobTimeout) as caught:
        next(stream)
    assert caught.value.job_id == "job_1"
    assert fake_time.now == pytest.approx(2.0)


def test_a_resumed_stream_names_its_job_when_the_poll_fails(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(sse_cut(), problem(500, "Internal Server Error"))
    stream = make_client(server, fake_time, max_retries=0).run("demo", "Hi", stream=True)
    with pytest.raises(ServerError) as caught:
        list(stream)
    assert caught.value.job_id == "job_1"


def test_a_resumed_stream_refuses_text_that_does_not_continue_the_deltas(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(sse_cut(("output", {"delta": "Bye"})), answer(200, job()))
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert next(stream) == "Bye"
    with pytest.raises(PlatformError, match="does not continue") as caught:
        next(stream)
    assert caught.value.job_id == "job_1"


def test_a_stream_that_drops_before_naming_its_job_is_a_connection_error(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(sse_cut(("starting", {}), job_id=None))
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    with pytest.raises(APIConnectionError, match="broke off"):
        list(stream)
    assert len(server.requests) == 1, "nothing to resume, and a run is never sent twice"

    server = Server(sse(("starting", {})))
    server.answers[0].headers.pop("X-Job-Id")
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    with pytest.raises(APIConnectionError, match="before naming its job"):
        list(stream)


def test_a_refused_stream_raises_the_problem_it_was_sent(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    refused = problem(404, "Not Found", "deployment 'nope' does not exist")
    # As on the wire: the body is not read yet when the client gets the answer.
    unread = httpx.Response(404, stream=Chunks([refused.content]), headers=refused.headers)
    with pytest.raises(NotFoundError) as caught:
        make_client(Server(unread), fake_time).run("nope", "Hi", stream=True)
    assert caught.value.detail == "deployment 'nope' does not exist"


def test_closing_a_stream_early_releases_it(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(sse(("output", {"delta": "a"}), ("output", {"delta": "b"})))
    with make_client(server, fake_time).run("demo", "Hi", stream=True) as stream:
        assert stream.job_id == "job_1"
        assert next(stream) == "a"
    with pytest.raises(StopIteration):
        next(stream)
    assert stream.job is None and len(server.requests) == 1


# --- retries --------------------------------------------------------------------------------


def test_submit_retries_429_honouring_retry_after_with_one_idempotency_key(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    limited = problem(429, "Too Many Requests")
    limited.headers["Retry-After"] = "2"
    server = Server(limited, answer(202, job(status="queued")))
    submitted = make_client(server, fake_time).submit(
        "demo", {"prompt": "Hi"}, webhook="https://example.com/hook", ttl_s=60
    )
    assert submitted.id == "job_1"
    assert fake_time.sleeps == [2.0]
    keys = {r.headers["idempotency-key"] for r in server.requests}
    assert len(server.requests) == 2 and len(keys) == 1
    assert server.requests[0].url.path == "/v1/deployments/demo/jobs"
    assert server.body(1) == {
        "input": {"prompt": "Hi"},
        "webhook": "https://example.com/hook",
        "ttl_s": 60,
    }


def test_503_and_dropped_connections_are_retried_with_one_idempotency_key(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        problem(503, "Service Unavailable"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("connection reset"),
        answer(202, job(status="queued")),
    )
    make_client(server, fake_time).submit("demo", "Hi", idempotency_key="my-key")
    assert len(server.requests) == 4
    assert {r.headers["idempotency-key"] for r in server.requests} == {"my-key"}
    # Full jitter with rand() = 0.5: half of 0.5 s, 1 s, 2 s.
    assert fake_time.sleeps == [0.25, 0.5, 1.0]


def test_retries_give_up_after_max_retries(fake_time: FakeTime, make_client: MakeClient) -> None:
    limited = problem(429, "Too Many Requests")
    limited.headers["Retry-After"] = "1"
    server = Server(*[limited] * 3)
    with pytest.raises(RateLimitError) as caught:
        make_client(server, fake_time, max_retries=2).jobs.get("job_1")
    assert caught.value.retry_after == 1.0
    assert len(server.requests) == 3

    refused = httpx.ConnectError("connection refused")
    server = Server(*[refused] * 4)
    with pytest.raises(APIConnectionError) as refused_error:
        make_client(server, fake_time, max_unavailable_s=0).jobs.get("job_1")
    assert len(server.requests) == 4
    assert "cannot reach the platform" in str(refused_error.value)
    assert not isinstance(refused_error.value, ConnectionError)  # the builtin stays distinct


def test_an_api_restart_is_ridden_out_past_max_retries(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    refused = httpx.ConnectError("connection refused")
    gateway = problem(502, "Bad Gateway")
    server = Server(*[refused] * 5, gateway, gateway, answer(202, job(status="queued")))
    submitted = make_client(server, fake_time).submit("demo", "Hi", idempotency_key="my-key")
    assert submitted.id == "job_1"
    assert {r.headers["idempotency-key"] for r in server.requests} == {"my-key"}
    # the backoff goes on doubling past the three counted retries, to its cap (8 s x 0.5)
    assert fake_time.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_an_outage_is_given_up_once_it_lasted_max_unavailable_s(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(*[httpx.ConnectError("connection refused")] * 20)
    with pytest.raises(APIConnectionError, match="6 tries"):
        make_client(server, fake_time, max_unavailable_s=10).jobs.get("job_1")
    # 7.75 s failed so far: the next wait (4 s) would pass 10 s
    assert fake_time.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0]


def test_an_outage_is_timed_from_the_first_failure_not_from_the_send(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    def held_then_dropped(_request: httpx.Request) -> httpx.Response:
        fake_time.now += 60.0  # a sync run the API held for a minute, then the API died
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    refused = httpx.ConnectError("connection refused")
    server = Server(held_then_dropped, *[refused] * 4, answer(200, job()))
    client = make_client(server, fake_time, max_unavailable_s=10)
    assert client.run("demo", "Hi") == "Hello there"
    assert len({r.headers["idempotency-key"] for r in server.requests}) == 1


def test_only_an_outage_is_retried_past_max_retries(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    limited = problem(429, "Too Many Requests")
    with pytest.raises(RateLimitError):
        make_client(Server(*[limited] * 4), fake_time).jobs.get("job_1")
    assert fake_time.sleeps == [0.25, 0.5, 1.0]  # busy, not down: max_retries bounds it

    fake_time.sleeps.clear()
    server = Server(*[httpx.ConnectError("connection refused")] * 2)
    with pytest.raises(APIConnectionError):
        make_client(server, fake_time, max_retries=0).jobs.get("job_1")
    assert len(server.requests) == 1  # max_retries=0 still turns every retry off


def test_a_retry_after_longer_than_a_minute_is_not_waited_for(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    limited = problem(429, "Too Many Requests")
    limited.headers["Retry-After"] = "3600"
    with pytest.raises(RateLimitError) as caught:
        make_client(Server(limited), fake_time).jobs.get("job_1")
    assert caught.value.retry_after == 3600.0
    assert fake_time.sleeps == []


def test_an_unkeyed_create_is_not_resent_once_it_may_have_arrived(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(httpx.ReadError("connection reset"))
    with pytest.raises(APIConnectionError):
        make_client(server, fake_time).deployments.create(name="demo", model="s3://m/d/")
    assert len(server.requests) == 1  # a resend could answer 409 for our own create

    created = {"name": "demo", "model": "s3://m/d/", "version": 1}
    server = Server(httpx.ConnectError("refused"), answer(201, created))
    made = make_client(server, fake_time).deployments.create(name="demo", model="s3://m/d/")
    assert made.version == 1  # a refused connect never arrived: safe to resend


def test_backoff_is_full_jitter_capped() -> None:
    policy = RetryPolicy(base_s=0.5, cap_s=8.0)
    assert [backoff_s(policy, n, lambda: 1.0) for n in range(7)] == [0.5, 1, 2, 4, 8, 8, 8]
    assert backoff_s(policy, 3, lambda: 0.0) == 0.0


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert parse_retry_after("7", now_s=0) == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now_s=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now_s=1445412490.0) == 0.0
    assert parse_retry_after("soon", now_s=0) is None
    assert parse_retry_after(None, now_s=0) is None


# --- resources ------------------------------------------------------------------------------


def test_jobs_list_follows_cursors_up_to_the_limit(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        answer(200, {"data": [job("job_1"), job("job_2")], "next_cursor": "c2"}),
        answer(200, {"data": [job("job_3"), job("job_4")], "next_cursor": "c3"}),
    )
    jobs = make_client(server, fake_time).jobs.list(deployment="demo", status="failed", limit=3)
    assert [j.id for j in jobs] == ["job_1", "job_2", "job_3"]
    first, second = (dict(r.url.params) for r in server.requests)
    assert first == {"deployment": "demo", "status": "failed", "limit": "3"}
    assert second == {"deployment": "demo", "status": "failed", "limit": "1", "cursor": "c2"}


def test_deployment_resource_calls(fake_time: FakeTime, make_client: MakeClient) -> None:
    dep = {"name": "demo", "model": "s3://m/d/", "max_workers": 1, "version": 2, "id": "dep_1"}
    dep["workers"] = {"idle": 1, "busy": 2}
    server = Server(
        answer(201, dep),
        answer(200, dep),
        answer(200, dep),
        answer(200, {"data": [dep], "next_cursor": None}),
        httpx.Response(204),
    )
    client = make_client(server, fake_time)
    created = client.deployments.create({"name": "demo"}, model="s3://m/d/")
    updated = client.deployments.update("demo", {"model": "s3://m/d/", "max_workers": 2})
    fetched = client.deployments.get("demo")
    listed = client.deployments.list()
    assert client.deployments.delete("demo") is None

    assert server.paths() == [
        "POST /v1/deployments",
        "PUT /v1/deployments/demo",
        "GET /v1/deployments/demo",
        "GET /v1/deployments",
        "DELETE /v1/deployments/demo",
    ]
    assert server.body(0) == {"name": "demo", "model": "s3://m/d/"}
    assert server.body(1) == {"name": "demo", "model": "s3://m/d/", "max_workers": 2}
    assert isinstance(created, Deployment) and created.version == 2
    assert fetched.workers == {"idle": 1, "busy": 2}
    assert fetched.spec == {"name": "demo", "model": "s3://m/d/", "max_workers": 1}
    assert [d.name for d in listed] == ["demo"] and updated.id == "dep_1"
    with pytest.raises(ValueError, match="does not match"):
        client.deployments.update("demo", {"name": "other"})


def test_billing_workers_webhooks_and_job_resources(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    record = {"id": 1, "phase": "busy", "seconds": "1.250", "amount": "0.000125"}
    server = Server(
        answer(200, {"data": [record], "next_cursor": None}),
        answer(200, {"data": [{"id": "wrk_1", "state": "idle"}]}),
        answer(200, {"secret": "whsec_abc"}),
        answer(200, job(status="canceled")),
        answer(502, {"title": "Bad Gateway"}),
    )
    client = make_client(server, fake_time)
    assert client.billing.records(deployment="demo", phase="busy", limit=10) == [record]
    assert client.workers.list(deployment="demo") == [{"id": "wrk_1", "state": "idle"}]
    assert client.webhooks.secret() == "whsec_abc"
    assert client.jobs.cancel("job_1").status == "canceled"
    # a rotation that may have happened is never sent twice
    with pytest.raises(APIError):
        client.webhooks.rotate_secret()
    assert dict(server.requests[0].url.params) == {
        "deployment": "demo",
        "phase": "busy",
        "limit": "10",
    }
    assert server.paths()[1:] == [
        "GET /v1/workers",
        "GET /v1/webhooks/secret",
        "POST /v1/jobs/job_1/cancel",
        "POST /v1/webhooks/secret/rotate",
    ]


def test_billing_check_and_the_webhook_secret(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(200, {"ok": True, "issues": []}),
        answer(200, {"secret": "whsec_new"}),
        answer(200, {"nope": 1}),
    )
    client = make_client(server, fake_time)
    assert client.billing.check() == {"ok": True, "issues": []}
    assert client.webhooks.rotate_secret() == "whsec_new"
    with pytest.raises(PlatformError, match="no secret"):
        client.webhooks.secret()
    assert server.paths() == [
        "GET /v1/billing/check",
        "POST /v1/webhooks/secret/rotate",
        "GET /v1/webhooks/secret",
    ]


def test_job_refresh_wait_and_cancel(fake_time: FakeTime, make_client: MakeClient) -> None:
    failed = job(status="failed", error={"type": "worker_lost", "message": "no heartbeat"})
    server = Server(
        answer(202, job(status="queued")),
        answer(200, job(status="running")),
        answer(200, failed),
        answer(200, job("job_1", "canceled")),
    )
    client = make_client(server, fake_time)
    submitted = client.submit("demo", "Hi")
    assert submitted.refresh().status == "running"
    with pytest.raises(JobFailed) as caught:
        submitted.wait(timeout=30)
    assert not isinstance(caught.value, ModelError)
    assert caught.value.error_type == "worker_lost"
    assert submitted.status == "failed" and submitted.error == failed["error"]
    assert submitted.cancel().status == "canceled"
    assert "Hi" not in repr(submitted)


# --- the async surface itself, and the names ------------------------------------------------


def test_async_client_natively(fake_time: FakeTime) -> None:
    """`async with`, `async for` and awaits, without the Blocking view the other tests use."""
    failed = job(status="failed", error={"type": "invalid_input", "message": "prompt too long"})
    server = Server(
        sse(("output", {"delta": "a"}), ("output", {"delta": "b"}), ("completed", job())),
        answer(202, job(status="queued")),
        answer(200, failed),
    )

    async def fake_sleep(seconds: float) -> None:
        fake_time.sleep(seconds)

    async def main() -> list[str]:
        transport = httpx.MockTransport(server)
        async with AsyncClient(BASE, KEY, transport=transport, sleep=fake_sleep) as client:
            async with await client.run("demo", "Hi", stream=True) as stream:
                deltas = [delta async for delta in stream]
            assert stream.job is not None and stream.job.status == "succeeded"
            submitted = await client.submit("demo", "Hi")
            with pytest.raises(ModelError) as caught:
                await submitted.wait()
            assert caught.value.job_id == "job_1"
            return deltas

    assert asyncio.run(main()) == ["a", "b"]


def test_connection_error_is_a_deprecated_alias_that_never_shadows_the_builtin() -> None:
    with pytest.warns(DeprecationWarning, match="APIConnectionError"):
        alias = sdk.ConnectionError
    assert alias is APIConnectionError
    assert not issubclass(APIConnectionError, ConnectionError)
    names: dict[str, Any] = {}
    exec("from sdk import *", names)
    assert "ConnectionError" not in names and names["APIConnectionError"] is APIConnectionError
    with pytest.raises(AttributeError):
        _ = sdk.NoSuchName  # type: ignore[attr-defined]

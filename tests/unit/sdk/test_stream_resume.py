"""A stream that ends early or whose connection drops is finished by polling its job (never by
sending the run again): the text it still owed, failures, the timeout, and when it cannot resume."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sdk import APIConnectionError, JobTimeout, ModelError, PlatformError, ServerError
from sdk._base import poll_interval_s
from tests.unit.sdk.mock_platform import Chunks, FakeTime, Server, answer, job, problem, sse
from tests.unit.sdk.twin import MakeClient


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

"""Streamed runs: SSE framing, text deltas, cold-start status events, terminal events and their
errors, a `restarted` event and text that does not add up, a refused stream, closing a stream
early."""

from __future__ import annotations

import json

import httpx
import pytest

from sdk import JobFailed, ModelError, NotFoundError, PlatformError, StreamRestarted
from sdk._sse import RunStatus, SSEDecoder
from tests.unit.sdk.mock_platform import Chunks, FakeTime, Server, job, problem, sse
from tests.unit.sdk.twin import MakeClient


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
            ("output", {"delta": " there"}),
            ("completed", job()),
        )
    )
    seen: list[RunStatus] = []
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True, on_status=seen.append)
    assert list(stream) == ["Hello", " there"]
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
        f"event: completed\r\ndata: {json.dumps(job(output={'text': 'ab'}))}\r\n\r\n"
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


def test_a_restart_whose_text_departs_raises_with_the_job_once_the_stream_ended(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    """Deltas already handed over cannot be taken back: after `restarted` none is handed over,
    the stream is read to its end (the job runs on, not canceled by a disconnect), and the
    caller gets the job's output through the error, never a text that differs from it."""
    server = Server(
        sse(
            ("running", {"attempt": 1, "worker_id": "wrk_1"}),
            ("output", {"delta": "Hi "}),
            ("running", {"attempt": 2, "worker_id": "wrk_2"}),
            ("restarted", {"job_id": "job_1", "attempt": 2, "reason": "new_attempt"}),
            ("output", {"delta": "Hello"}),
            ("output", {"delta": " there"}),
            ("completed", job(attempt=2)),
        )
    )
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert next(stream) == "Hi "
    with pytest.raises(StreamRestarted) as caught:
        next(stream)
    assert caught.value.job_id == "job_1" and caught.value.attempt == 2
    assert caught.value.job.text == "Hello there" == stream.text
    assert server.requests[-1].url.path.endswith("/run"), "read to its end: no poll, no cancel"


def test_the_text_a_stream_misses_comes_as_one_last_delta(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    """A server that lost deltas and did not fill them in: the output past what was handed
    over is yielded last, so the deltas add up to it."""
    server = Server(sse(("output", {"delta": "Hello"}), ("completed", job())))
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert list(stream) == ["Hello", " there"] and stream.text == "Hello there"


def test_deltas_that_the_output_does_not_continue_raise(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(sse(("output", {"delta": "Bye"}), ("completed", job())))
    stream = make_client(server, fake_time).run("demo", "Hi", stream=True)
    assert next(stream) == "Bye"
    with pytest.raises(PlatformError, match="does not continue") as caught:
        next(stream)
    assert caught.value.job_id == "job_1" and not isinstance(caught.value, StreamRestarted)


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

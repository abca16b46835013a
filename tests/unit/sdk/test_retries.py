"""Retries: 429 with Retry-After, 503 and dropped connections under one idempotency key, the
max_retries bound, riding out an API restart up to max_unavailable_s, what is never resent, and
the backoff and Retry-After arithmetic."""

from __future__ import annotations

import httpx
import pytest

from sdk import APIConnectionError, RateLimitError
from sdk._base import RetryPolicy, backoff_s, parse_retry_after
from tests.unit.sdk.mock_platform import FakeTime, Server, answer, job, problem
from tests.unit.sdk.twin import MakeClient


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

"""SDK resources added for batches, API keys, usage and readiness, against httpx.MockTransport:
requests as documented, parsing, polling, streaming results; each test runs over both clients
(the `twin` fixture of test_sdk_client.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import (
    APIConnectionError,
    ApiKey,
    AsyncClient,
    BatchTimeout,
    ConflictError,
    DeploymentNotReady,
    InvalidRequestError,
    NotFoundError,
    PlatformError,
)
from sdk._base import is_missing_route
from sdk._flows import PAGE_SIZE
from tests.unit.test_sdk_client import (
    BASE,
    KEY,
    Chunks,
    FakeTime,
    MakeClient,
    Server,
    Twin,
    _isolated_config,
    answer,
    fake_time,
    make_client,
    problem,
    twin,
)

__all__ = ["_isolated_config", "fake_time", "make_client", "twin"]  # fixtures, used by name


def batch(status: str = "running", batch_id: str = "bat_1", **counts: int) -> dict[str, Any]:
    base = dict.fromkeys(
        ("queued", "starting", "running", "succeeded", "failed", "canceled", "expired"), 0
    )
    base["timed_out"] = 0
    base.update(counts)
    return {
        "id": batch_id,
        "deployment": "demo",
        "status": status,
        "total": sum(base.values()),
        "max_in_flight": 4,
        "counts": base,
        "results_uri": None,
        "webhook": None,
        "webhook_status": "none",
    }


def jsonl(*lines: dict[str, Any], status: str = "completed") -> httpx.Response:
    text = "".join(json.dumps(line) + "\n" for line in lines)
    return httpx.Response(
        200,
        content=text.encode(),
        headers={"content-type": "application/jsonl", "X-Batch-Status": status},
    )


RESULT = {"index": 0, "job_id": "job_1", "status": "succeeded", "output": {"text": "x"}}


# --- batches --------------------------------------------------------------------------------


def test_batch_from_a_list_sends_inputs_with_an_idempotency_key(
    fake_time: FakeTime, make_client: MakeClient, twin: Twin
) -> None:
    server = Server(answer(201, batch(queued=2)))
    created = make_client(server, fake_time).batches.create(
        [{"prompt": "a", "max_tokens": 4}, "b"],
        deployment="demo",
        webhook="https://example.com/hook",
        max_in_flight=2,
    )
    assert isinstance(created, twin.Batch) and created.id == "bat_1" and created.total == 2
    [request] = server.requests
    assert f"{request.method} {request.url.path}" == "POST /v1/batches"
    uuid.UUID(request.headers["idempotency-key"])
    assert server.body(0) == {
        "deployment": "demo",
        "inputs": [{"prompt": "a", "max_tokens": 4}, {"prompt": "b"}],
        "webhook": "https://example.com/hook",
        "max_in_flight": 2,
    }


def test_batch_from_a_file_sends_its_text_and_from_s3_its_uri(
    fake_time: FakeTime, tmp_path: Path, make_client: MakeClient
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    server = Server(answer(201, batch(queued=2)), answer(201, batch(queued=2)))
    client = make_client(server, fake_time)
    client.batches.create(path, deployment="demo")
    client.batches.create("s3://inputs/in.jsonl", deployment="demo")
    assert server.body(0) == {"deployment": "demo", "input_jsonl": path.read_text()}
    assert server.body(1) == {"deployment": "demo", "input_uri": "s3://inputs/in.jsonl"}
    with pytest.raises(TypeError, match="list of inputs"):
        client.batches.create({"prompt": "one"}, deployment="demo")  # type: ignore[arg-type]


def test_batch_create_is_retried_with_the_same_key_after_a_dropped_connection(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(httpx.ReadError("connection reset"), answer(200, batch(queued=1)))
    make_client(server, fake_time).batches.create(["a"], deployment="demo")
    keys = {r.headers["idempotency-key"] for r in server.requests}
    assert len(server.requests) == 2 and len(keys) == 1


def test_batch_line_errors_come_back_with_their_lines(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    errors = [{"line": 2, "field": "max_tokens", "message": "Input should be >= 1"}]
    server = Server(problem(422, "Invalid Request", "1 invalid input field(s)", errors=errors))
    with pytest.raises(InvalidRequestError) as e:
        make_client(server, fake_time).batches.create(["a", "b"], deployment="demo")
    assert e.value.errors == errors


def test_batch_wait_polls_with_updates_until_completed(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        answer(200, batch(queued=1, running=1)),
        answer(200, batch(running=1, succeeded=1)),
        answer(200, batch("completed", succeeded=1, failed=1)),
    )
    client = make_client(server, fake_time)
    seen: list[tuple[str, int]] = []
    done = client.batches.wait(
        "bat_1", timeout=60, on_update=lambda b: seen.append((b.status, b.finished))
    )
    assert done.status == "completed" and done.finished == 2 and done.is_terminal
    assert seen == [("running", 0), ("running", 1), ("completed", 2)]
    assert server.paths() == ["GET /v1/batches/bat_1"] * 3


def test_batch_wait_times_out_naming_the_batch(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(*[answer(200, batch(queued=1))] * 50)
    client = make_client(server, fake_time)
    created = client.batches.get("bat_1")
    with pytest.raises(BatchTimeout) as e:
        created.wait(timeout=5)
    assert e.value.batch_id == "bat_1" and "bat_1" in str(e.value)
    assert fake_time.now == pytest.approx(5)


def test_batch_results_stream_parsed_lines_and_the_status(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    second = {**RESULT, "index": 1, "job_id": "job_2", "status": "failed", "output": None}
    server = Server(jsonl(RESULT, second, status="running"))
    with make_client(server, fake_time).batches.results("bat_1") as results:
        assert results.status == "running"
        lines = list(results)
    assert lines == [RESULT, second]
    assert server.requests[0].headers["accept"] == "application/jsonl"


def test_batch_results_refuse_a_line_that_is_not_json(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    bad = httpx.Response(200, content=b'{"index": 0}\nnot json\n')
    results = make_client(Server(bad), fake_time).batches.results("bat_1")
    assert next(results) == {"index": 0}
    with pytest.raises(PlatformError, match="not valid JSON"):
        next(results)


def test_batch_list_cancel_and_conflict(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(200, {"data": [batch()], "next_cursor": None}),
        answer(200, batch("canceled", canceled=2)),
        problem(409, "Conflict", "batch 'bat_1' is already completed"),
    )
    client = make_client(server, fake_time)
    [listed] = client.batches.list(deployment="demo", status="running")
    assert listed.id == "bat_1"
    assert dict(server.requests[0].url.params) == {
        "deployment": "demo",
        "status": "running",
        "limit": str(PAGE_SIZE),
    }
    assert client.batches.cancel("bat_1").status == "canceled"
    with pytest.raises(ConflictError):
        client.batches.cancel("bat_1")
    assert server.paths()[1:] == ["POST /v1/batches/bat_1/cancel"] * 2


def test_batch_methods_and_results_that_break_off(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    first = (json.dumps(RESULT) + "\n").encode()
    dropped = httpx.Response(
        200,
        stream=Chunks([first], httpx.ReadError("connection reset")),
        headers={"X-Batch-Status": "running"},
    )
    server = Server(
        answer(201, batch(queued=2)),
        answer(200, batch(running=1, succeeded=1)),
        dropped,
        answer(200, batch("canceled", succeeded=1, canceled=1)),
    )
    client = make_client(server, fake_time)
    created = client.batches.create(["a", "b"], deployment="demo")
    assert created.refresh().finished == 1
    results = created.results()
    assert results.status == "running" and next(results) == RESULT
    with pytest.raises(APIConnectionError, match="broke off"):
        next(results)
    assert created.cancel().status == "canceled" and created.counts["canceled"] == 1
    assert server.paths() == [
        "POST /v1/batches",
        "GET /v1/batches/bat_1",
        "GET /v1/batches/bat_1/results",
        "POST /v1/batches/bat_1/cancel",
    ]


def test_async_batches_natively(fake_time: FakeTime) -> None:
    """`async with` and `async for` over results, without the Blocking view."""
    server = Server(
        answer(201, batch(queued=1)),
        answer(200, batch("completed", succeeded=1)),
        jsonl(RESULT),
    )

    async def fake_sleep(seconds: float) -> None:
        fake_time.sleep(seconds)

    async def main() -> tuple[str, list[dict[str, Any]], str | None]:
        transport = httpx.MockTransport(server)
        async with AsyncClient(BASE, KEY, transport=transport, sleep=fake_sleep) as client:
            created = await client.batches.create(["a"], deployment="demo")
            await created.wait(timeout=10)
            async with await created.results() as results:
                lines = [line async for line in results]
            return created.status, lines, results.status

    assert asyncio.run(main()) == ("completed", [RESULT], "completed")


# --- keys -----------------------------------------------------------------------------------


KEY_ROW = {
    "id": "key_1",
    "name": "ci",
    "prefix": "pk_ab12",
    "scopes": ["run", "read"],
    "created_at": "2024-05-01T12:00:00Z",
    "revoked_at": None,
}


def test_keys_create_list_revoke(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(201, {**KEY_ROW, "key": "pk_ab12_secret"}),
        answer(200, {"data": [KEY_ROW]}),
        httpx.Response(204),
    )
    client = make_client(server, fake_time)
    key = client.keys.create(name="ci", scopes=["run", "read"])
    assert isinstance(key, ApiKey) and key.key == "pk_ab12_secret"
    assert "secret" not in repr(key)
    assert server.body(0) == {"name": "ci", "scopes": ["run", "read"]}
    [listed] = client.keys.list()
    assert listed.key is None and listed.scopes == ["run", "read"] and not listed.revoked
    assert client.keys.revoke("key_1") is None
    assert server.paths() == ["POST /v1/keys", "GET /v1/keys", "DELETE /v1/keys/key_1"]


def test_key_create_is_not_resent_after_a_dropped_connection(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(httpx.ReadError("reset"))
    with pytest.raises(PlatformError):
        make_client(server, fake_time).keys.create(name="ci")
    assert len(server.requests) == 1, "a re-sent create could make a second key"


# --- usage ----------------------------------------------------------------------------------


def test_usage_list_pages_and_sends_times_in_utc(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    row = {"job_id": "job_1", "deployment": "demo", "cost": "0.000100000"}
    server = Server(
        answer(200, {"data": [row], "next_cursor": "c2"}),
        answer(200, {"data": [row], "next_cursor": None}),
    )
    since = datetime(2024, 5, 1, 12, tzinfo=UTC)
    client = make_client(server, fake_time)
    assert client.usage.list(deployment="demo", since=since, until="2024-06-01") == [row, row]
    params = dict(server.requests[0].url.params)
    assert params["since"] == "2024-05-01T12:00:00Z" and params["until"] == "2024-06-01"
    assert params["deployment"] == "demo"
    assert server.requests[1].url.params["cursor"] == "c2"
    with pytest.raises(ValueError, match="time zone"):
        client.usage.list(since=datetime(2024, 5, 1))


def test_usage_summary_rows_carry_their_group_as_key(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    body = {
        "group_by": "phase",
        "data": [
            {"group": "busy", "seconds": "2.000", "amount": "0.000200000"},
            {"phase": "idle", "seconds": "1.000", "amount": "0.000100000"},
        ],
        "total_amount": "0.000300000",
    }
    server = Server(answer(200, body))
    rows = make_client(server, fake_time).usage.summary(group_by="phase", since="2024-05-01")
    assert [r["key"] for r in rows] == ["busy", "idle"]
    assert dict(server.requests[0].url.params) == {"group_by": "phase", "since": "2024-05-01"}
    assert server.paths() == ["GET /v1/usage/summary"]


def test_a_missing_usage_endpoint_is_told_apart_from_a_missing_thing(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        problem(404, "Not Found", "Not Found"),
        problem(404, "Not Found", "deployment 'nope' does not exist"),
    )
    client = make_client(server, fake_time)
    with pytest.raises(NotFoundError) as route:
        client.usage.summary()
    with pytest.raises(NotFoundError) as thing:
        client.deployments.get("nope")
    assert is_missing_route(route.value) and not is_missing_route(thing.value)


# --- readiness, job ids on errors, pages ----------------------------------------------------


def worker(state: str, version: int = 2, worker_id: str = "wrk_1", **more: Any) -> dict[str, Any]:
    return {
        "id": worker_id,
        "deployment": "demo",
        "deployment_version": version,
        "state": state,
        **more,
    }


def test_wait_ready_follows_the_new_version_until_idle(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        answer(200, {"data": [worker("idle", version=1, worker_id="wrk_old")]}),
        answer(200, {"data": [worker("booting"), worker("idle", version=1, worker_id="wrk_old")]}),
        answer(200, {"data": [worker("loading")]}),
        answer(200, {"data": [worker("idle")]}),
    )
    seen: list[list[str]] = []
    ready = make_client(server, fake_time).deployments.wait_ready(
        "demo", version=2, timeout=60, on_update=lambda ws: seen.append([w["state"] for w in ws])
    )
    assert ready["id"] == "wrk_1" and ready["state"] == "idle"
    assert seen == [[], ["booting"], ["loading"], ["idle"]]
    assert set(server.paths()) == {"GET /v1/workers"}


def test_wait_ready_reads_the_current_version_and_reports_a_new_failure(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    old_failure = worker("failed", worker_id="wrk_0", reason="earlier")
    server = Server(
        answer(200, {"name": "demo", "version": 2}),
        answer(200, {"data": [old_failure, worker("loading")]}),
        answer(200, {"data": [old_failure, worker("failed", reason="ObjectNotFound: s3://m/x")]}),
    )
    with pytest.raises(DeploymentNotReady) as e:
        make_client(server, fake_time).deployments.wait_ready("demo")
    assert e.value.version == 2 and not e.value.timed_out
    assert "wrk_1 failed: ObjectNotFound" in str(e.value)


def test_wait_ready_times_out(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(*[answer(200, {"data": [worker("booting")]})] * 40)
    with pytest.raises(DeploymentNotReady) as e:
        make_client(server, fake_time).deployments.wait_ready("demo", version=2, timeout=3)
    assert e.value.timed_out and "booting" in e.value.reason


def test_errors_about_a_job_carry_its_id(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        problem(404, "Not Found", "job 'job_9' does not exist"),
        httpx.ConnectError("refused"),
        httpx.ConnectError("refused"),
    )
    client = make_client(server, fake_time, max_retries=1, max_unavailable_s=0)
    with pytest.raises(NotFoundError) as missing:
        client.jobs.get("job_9")
    assert missing.value.job_id == "job_9"
    with pytest.raises(PlatformError) as unreachable:
        client.jobs.cancel("job_9")
    assert unreachable.value.job_id == "job_9"


def test_job_wait_reports_every_state(fake_time: FakeTime, make_client: MakeClient) -> None:
    from tests.unit.test_sdk_client import job

    server = Server(
        answer(200, job(status="starting", status_reason="no_capacity")),
        answer(200, job(status="running")),
        answer(200, job()),
    )
    client = make_client(server, fake_time)
    first = client.jobs.get("job_1")
    seen: list[str] = []
    first.wait(timeout=30, on_update=lambda j: seen.append(j.status))
    assert seen == ["starting", "running", "succeeded"]


def test_list_pages_never_ask_for_more_than_the_endpoints_allow(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    from tests.unit.test_sdk_client import job

    page = [job(f"job_{i}") for i in range(PAGE_SIZE)]
    server = Server(
        answer(200, {"data": page, "next_cursor": "c2"}),
        answer(200, {"data": page[:50], "next_cursor": "c3"}),
    )
    jobs = make_client(server, fake_time).jobs.list(limit=150)
    assert len(jobs) == 150
    assert [r.url.params["limit"] for r in server.requests] == [str(PAGE_SIZE), "50"]

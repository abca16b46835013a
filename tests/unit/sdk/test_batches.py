"""Batches: creating one from a list, a file or an S3 URI under one idempotency key, line errors,
waiting, streaming results (and results that break off), list and cancel, natively async too."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import (
    APIConnectionError,
    AsyncClient,
    BatchTimeout,
    ConflictError,
    InvalidRequestError,
    PlatformError,
)
from sdk._flows import PAGE_SIZE
from tests.unit.sdk.mock_platform import BASE, KEY, Chunks, FakeTime, Server, answer, problem
from tests.unit.sdk.twin import MakeClient, Twin


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

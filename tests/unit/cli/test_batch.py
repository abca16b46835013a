"""`platform batch`: submit (and wait with progress), results to stdout or a file, status, cancel
and list, and a platform too old to serve batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.unit.cli.mock_api import Routes, invoke, ok


def batch(status: str = "running", **counts: int) -> dict[str, Any]:
    full = {"queued": 0, "running": 0, "succeeded": 0, "failed": 0, "canceled": 0, **counts}
    return {"id": "bat_1", "deployment": "demo", "status": status, "total": 3, "counts": full}


def test_batch_submit_sends_the_file_and_waits_with_progress(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n')
    routes = Routes(
        {
            "POST /v1/batches": ok(batch(queued=3), 201),
            "GET /v1/batches/bat_1": [
                ok(batch(queued=1, running=1, succeeded=1)),
                ok(batch("completed", succeeded=2, failed=1)),
            ],
        }
    )
    args = ["batch", "submit", str(source), "--deployment", "demo", "--max-in-flight", "2"]
    result = invoke([*args, "--wait"], routes)
    assert result.exit_code == 0, result.output
    assert routes.body("POST /v1/batches") == {
        "deployment": "demo",
        "input_jsonl": source.read_text(),
        "max_in_flight": 2,
    }
    assert "batch bat_1: 3 jobs on demo" in result.stdout
    assert "batch bat_1 completed: failed=1 succeeded=2" in result.stdout
    # Piped: one progress line per change, on stderr.
    assert "bat_1 running: queued=1 running=1 succeeded=1" in result.stderr
    assert "bat_1 completed: failed=1 succeeded=2" in result.stderr


def test_batch_submit_json_and_a_canceled_batch_exits_1(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n')
    routes = Routes(
        {
            "POST /v1/batches": ok(batch(queued=1), 201),
            "GET /v1/batches/bat_1": ok(batch("canceled", canceled=1)),
        }
    )
    result = invoke(["batch", "submit", str(source), "-d", "demo", "--wait", "--json"], routes)
    assert result.exit_code == 1
    assert json.loads(result.stdout)["status"] == "canceled"


def test_batch_submit_of_a_missing_file_or_bad_lines_exits_1(tmp_path: Path) -> None:
    result = invoke(["batch", "submit", str(tmp_path / "nope.jsonl"), "-d", "demo"], Routes({}))
    assert result.exit_code == 1 and "no such file" in result.stderr

    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a", "max_tokens": 0}\n')
    errors = [{"line": 1, "field": "max_tokens", "message": "Input should be >= 1"}]
    body = {"title": "Invalid Request", "status": 422, "detail": "1 invalid", "errors": errors}
    result = invoke(
        ["batch", "submit", str(source), "-d", "demo"], Routes({"POST /v1/batches": ok(body, 422)})
    )
    assert result.exit_code == 1 and "max_tokens: Input should be >= 1" in result.stderr


def test_a_platform_without_batches_is_named_as_older() -> None:
    no_route = {"title": "Not Found", "status": 404, "detail": "Not Found"}
    no_route["instance"] = "/v1/batches"
    result = invoke(["batch", "list"], Routes({"GET /v1/batches": ok(no_route, 404)}))
    assert result.exit_code == 1
    assert "does not serve /v1/batches: it is older than this CLI" in result.stderr


def test_batch_submit_quiet_prints_only_the_id(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n')
    routes = Routes({"POST /v1/batches": ok(batch(queued=1), 201)})
    result = invoke(["batch", "submit", str(source), "-d", "demo", "-q"], routes)
    assert result.exit_code == 0 and result.stdout == "bat_1\n"


def test_batch_results_to_stdout_and_to_a_file(tmp_path: Path) -> None:
    lines = [{"index": 0, "job_id": "job_1", "status": "succeeded", "output": {"text": "x"}}]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    response = httpx.Response(200, content=body, headers={"X-Batch-Status": "running"})
    routes = Routes({"GET /v1/batches/bat_1/results": response})
    result = invoke(["batch", "results", "bat_1"], routes)
    assert result.exit_code == 0, result.output
    assert [json.loads(x) for x in result.stdout.splitlines()] == lines
    assert "partial results" in result.stderr

    out = tmp_path / "results.jsonl"
    result = invoke(["batch", "results", "bat_1", "--output", str(out)], routes)
    assert result.exit_code == 0 and result.stdout == ""
    assert [json.loads(x) for x in out.read_text().splitlines()] == lines


def test_batch_status_cancel_and_list() -> None:
    routes = Routes(
        {
            "GET /v1/batches/bat_1": ok(batch(queued=1, succeeded=2)),
            "POST /v1/batches/bat_1/cancel": ok(batch("canceled", canceled=1, succeeded=2)),
            "GET /v1/batches": ok({"data": [batch()], "next_cursor": None}),
        }
    )
    result = invoke(["batch", "status", "bat_1"], routes)
    assert result.exit_code == 0 and "finished:   2/3" in result.stdout
    result = invoke(["batch", "cancel", "bat_1"], routes)
    assert "batch bat_1: canceled (canceled=1 succeeded=2)" in result.stdout
    result = invoke(["batch", "list", "--json"], routes)
    assert json.loads(result.stdout)[0]["id"] == "bat_1"

"""The newer `platform` commands through CliRunner against httpx.MockTransport: keys, batch,
usage, jobs watch, status, deploy --wait and models verify."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk.cli import models as models_cli
from sdk.cli.usage import bar_chart, summarize
from tests.unit.test_cli import DEPLOYMENT, Routes, _isolated_config, invoke, not_found

__all__ = ["_isolated_config"]  # an autouse fixture


def ok(body: Any, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def batch(status: str = "running", **counts: int) -> dict[str, Any]:
    full = {"queued": 0, "running": 0, "succeeded": 0, "failed": 0, "canceled": 0, **counts}
    return {"id": "bat_1", "deployment": "demo", "status": status, "total": 3, "counts": full}


# --- every command has an example -----------------------------------------------------------


def _commands() -> list[list[str]]:
    import typer.main

    from sdk.cli.main import app

    group = typer.main.get_command(app)
    out = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None)
        if subcommands:
            out += [[name, sub] for sub in subcommands]
        else:
            out.append([name])
    return out


@pytest.mark.parametrize("path", _commands(), ids=" ".join)
def test_every_command_has_help_with_an_example(path: list[str]) -> None:
    result = invoke([*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.stdout and f"platform {' '.join(path)}" in result.stdout


# --- keys -----------------------------------------------------------------------------------

KEY_ROW = {"id": "key_1", "name": "ci", "prefix": "pk_ab", "scopes": ["run"], "revoked_at": None}


def test_keys_create_prints_only_the_secret_on_stdout() -> None:
    routes = Routes({"POST /v1/keys": ok({**KEY_ROW, "key": "pk_ab_secret"}, 201)})
    result = invoke(["keys", "create", "--name", "ci", "--scope", "run"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout == "pk_ab_secret\n"
    assert "key_1" in result.stderr and "not shown again" in result.stderr
    assert routes.body("POST /v1/keys") == {"name": "ci", "scopes": ["run"]}

    result = invoke(["keys", "create", "--json"], routes)
    assert json.loads(result.stdout)["key"] == "pk_ab_secret"


def test_keys_create_refuses_an_unknown_scope_locally() -> None:
    routes = Routes({})
    result = invoke(["keys", "create", "--scope", "root"], routes)
    assert result.exit_code == 1 and "unknown root" in result.stderr
    assert routes.requests == []


def test_keys_list_and_revoke() -> None:
    routes = Routes(
        {"GET /v1/keys": ok({"data": [KEY_ROW]}), "DELETE /v1/keys/key_1": httpx.Response(204)}
    )
    result = invoke(["keys", "list"], routes)
    assert result.exit_code == 0 and "key_1\tci\tpk_ab\trun" in result.stdout
    assert json.loads(invoke(["keys", "list", "--json"], routes).stdout) == [KEY_ROW]
    result = invoke(["keys", "revoke", "key_1"], routes)
    assert result.exit_code == 0 and "revoked key key_1" in result.stdout
    result = invoke(["keys", "revoke", "key_2"], routes)
    assert result.exit_code == 1, "a 404 is the user's error"


# --- batch ----------------------------------------------------------------------------------


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


# --- usage ----------------------------------------------------------------------------------

RECORDS = [
    {
        "deployment": "demo",
        "phase": "boot",
        "start": "2024-05-01T10:00:00Z",
        "seconds": "2.000",
        "amount": "0.000200000",
    },
    {
        "deployment": "demo",
        "phase": "busy",
        "start": "2024-05-01T10:00:02Z",
        "seconds": "4.000",
        "amount": "0.000400000",
    },
    {
        "deployment": "chat",
        "phase": "busy",
        "start": "2024-05-02T09:00:00Z",
        "seconds": "1.000",
        "amount": "0.000100000",
    },
]


def test_usage_falls_back_to_billing_records_when_the_summary_is_missing() -> None:
    # An older platform: the route itself is missing (FastAPI's bare "Not Found").
    no_route = ok({"title": "Not Found", "status": 404, "detail": "Not Found"}, 404)
    routes = Routes(
        {
            "GET /v1/usage/summary": no_route,
            "GET /v1/billing/records": ok({"data": RECORDS, "next_cursor": None}),
        }
    )
    result = invoke(["usage"], routes)
    assert result.exit_code == 0, result.output
    assert "demo\t6.000\t0.000600000\t2" in result.stdout
    assert "chat\t1.000\t0.000100000\t1" in result.stdout
    assert "total: 0.000700000 for 7.000 s" in result.stdout
    assert "cost by phase" in result.stdout
    bars = [line for line in result.stdout.splitlines() if "#" in line]
    assert [b.split()[0] for b in bars] == ["boot", "busy"]
    assert bars[1].count("#") == 30 and bars[0].count("#") == 12
    assert "summing its billing records" in result.stderr

    by_day = json.loads(invoke(["usage", "--by", "day", "--json"], routes).stdout)
    assert by_day["source"] == "billing_records"
    assert [(r["key"], r["amount"]) for r in by_day["data"]] == [
        ("2024-05-01", "0.000600000"),
        ("2024-05-02", "0.000100000"),
    ]
    assert invoke(["usage", "--by", "api_key"], routes).exit_code == 1


def test_usage_reads_the_summary_when_the_platform_has_it() -> None:
    by_dep = {"data": [{"group": "demo", "seconds": "6.000", "amount": "0.0006", "jobs": 3}]}
    by_phase = {"data": [{"group": "busy", "seconds": "4", "amount": "0.0004"}]}

    def summary(request: httpx.Request) -> httpx.Response:
        group = request.url.params["group_by"]
        return ok(by_phase if group == "phase" else by_dep)

    transport = httpx.MockTransport(summary)
    result = invoke(["usage", "--csv"], transport=transport)
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows == [["deployment", "seconds", "amount", "jobs"], ["demo", "6.000", "0.0006", "3"]]
    result = invoke(["usage"], transport=transport)
    assert "busy" in result.stdout.split("cost by phase")[1]


def test_usage_of_one_deployment_sums_its_billing_records() -> None:
    routes = Routes({"GET /v1/billing/records": ok({"data": RECORDS[:2], "next_cursor": None})})
    args = ["usage", "--by", "hour", "--deployment", "demo", "--since", "2024-05-01T00:00:00Z"]
    result = invoke([*args, "--json"], routes)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["data"][0]["key"] == "2024-05-01T10:00Z"
    params = routes.requests[0].url.params
    assert params["deployment"] == "demo" and params["since"] == "2024-05-01T00:00:00Z"
    assert routes.called() == ["GET /v1/billing/records"], "the summary has no deployment filter"


def test_summarize_and_bar_chart_are_exact() -> None:
    rows = summarize(RECORDS * 3, "phase")
    assert rows == [
        {"key": "boot", "seconds": "6.000", "amount": "0.000600000", "records": 3},
        {"key": "busy", "seconds": "15.000", "amount": "0.001500000", "records": 6},
    ]
    assert bar_chart([{"key": "idle", "amount": "0"}], tty=False) == ["  (nothing billed yet)"]
    tiny = bar_chart([{"key": "a", "amount": "1"}, {"key": "b", "amount": "0.0001"}], tty=True)
    assert tiny[1].count("█") == 1, "a non-zero amount always shows"


# --- jobs watch -----------------------------------------------------------------------------


def job(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "job_1", "deployment": "demo", "status": status, "attempt": 1, **fields}


def test_jobs_watch_prints_each_change_until_the_end() -> None:
    routes = Routes(
        {
            "GET /v1/jobs/job_1": [
                ok(job("queued", queue_position=2, eta_s=3.2)),
                ok(job("queued", queue_position=2, eta_s=3.0)),
                ok(job("starting", status_reason="no_capacity")),
                ok(job("running")),
                ok(job("succeeded", output={"text": "hello", "finish_reason": "stop"})),
            ]
        }
    )
    result = invoke(["jobs", "watch", "job_1"], routes)
    assert result.exit_code == 0, result.output
    states = [line.split("s  ", 1)[1] for line in result.stdout.splitlines()]
    assert states == [
        "queued (position 2, eta 3s)",
        "starting (no_capacity)",
        "running (attempt 1)",
        "succeeded: 5 chars (stop)",
    ]


def test_jobs_watch_exit_codes_follow_the_end() -> None:
    model_error = {"type": "model_error", "message": "bad"}
    routes = Routes({"GET /v1/jobs/job_1": ok(job("failed", error=model_error))})
    result = invoke(["jobs", "watch", "job_1", "--json"], routes)
    assert result.exit_code == 1
    assert json.loads(result.stdout.splitlines()[0])["status"] == "failed"
    assert "job: job_1" in result.stderr

    lost = {"type": "deployment_unavailable", "message": "no worker"}
    routes = Routes({"GET /v1/jobs/job_1": ok(job("failed", error=lost))})
    assert invoke(["jobs", "watch", "job_1"], routes).exit_code == 2


def test_run_detach_queues_a_job_and_prints_its_id() -> None:
    routes = Routes({"POST /v1/deployments/demo/jobs": ok(job("queued"), 202)})
    result = invoke(["run", "demo", "-i", "prompt=Hi", "--detach"], routes)
    assert result.exit_code == 0 and result.stdout == "job_1\n"
    assert routes.body("POST /v1/deployments/demo/jobs") == {"input": {"prompt": "Hi"}}
    assert invoke(["run", "demo", "-i", "prompt=Hi", "--detach", "--stream"], routes).exit_code == 1


def test_keys_revoke_by_the_key_or_its_prefix() -> None:
    other = {**KEY_ROW, "id": "key_2", "prefix": "pk_cd"}
    routes = Routes(
        {
            "GET /v1/keys": ok({"data": [other, KEY_ROW]}),
            "DELETE /v1/keys/key_1": httpx.Response(204),
        }
    )
    assert "revoked key key_1" in invoke(["keys", "revoke", "pk_ab_se_cr_et"], routes).stdout
    assert "revoked key key_1" in invoke(["keys", "revoke", "pk_ab"], routes).stdout
    result = invoke(["keys", "revoke", "pk_zz_secret"], routes)
    assert result.exit_code == 1 and "no API key" in result.stderr


# --- status ---------------------------------------------------------------------------------


def test_status_shows_queues_and_workers_with_reasons() -> None:
    def jobs(request: httpx.Request) -> httpx.Response:
        status = request.url.params["status"]
        data = [job(status)] * (2 if status == "queued" else 1)
        return ok({"data": data, "next_cursor": None})

    workers = [
        {"id": "wrk_1", "deployment": "demo", "deployment_version": 3, "state": "idle"},
        {
            "id": "wrk_2",
            "deployment": "demo",
            "deployment_version": 3,
            "state": "failed",
            "reason": "crash_loop",
        },
        {"id": "wrk_3", "deployment": "demo", "deployment_version": 2, "state": "stopped"},
    ]

    scaling = {"desired": 2, "actual": 3, "reason": "scale_down", "next_prewarm_at": None}
    between = {"desired": 0, "actual": 0, "reason": "idle", "next_prewarm_at": "2026-01-01T12:00Z"}
    deployments = [
        {**DEPLOYMENT, "scaling": scaling},
        {**DEPLOYMENT, "name": "cron", "workers": {}, "scaling": between},
        {**DEPLOYMENT, "name": "new"},  # no decision yet
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            return jobs(request)
        if request.url.path == "/v1/workers":
            return ok({"data": workers})
        return ok({"data": deployments})

    result = invoke(["status"], transport=httpx.MockTransport(handler))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "3 deployment(s), 2 worker(s), 3 job(s) waiting" in out
    assert "desired\tactual\tscaling\tnext pre-warm" in out
    assert "demo\t3\tbusy=2 idle=1\t2\t1\t2\t3\tscale_down\t-\n" in out
    assert "cron\t3\tnone\t0\t0\t0\t0\tidle\t2026-01-01T12:00Z\n" in out
    assert "new\t3\tbusy=2 idle=1\t0\t0\t-\t-\t-\t-\n" in out, "no decision yet"
    assert "wrk_2\tdemo\t3\tfailed\tcrash_loop" in out
    assert "wrk_3" not in out, "stopped workers are history"
    assert "warm pool" not in out, "there is no warm pool to report"
    data = json.loads(invoke(["status", "--json"], transport=httpx.MockTransport(handler)).stdout)
    assert data["deployments"][0]["queued"] == 2 and "warm_pool" not in data
    assert data["deployments"][0]["scaling"] == scaling
    assert data["deployments"][2]["scaling"] is None
    assert [w["id"] for w in data["workers"]] == ["wrk_1", "wrk_2"]


# --- deploy --wait --------------------------------------------------------------------------


def test_deploy_wait_follows_the_new_versions_worker_to_idle() -> None:
    updated = {**DEPLOYMENT, "min_workers": 1, "version": 4}

    def w(state: str, version: int = 4) -> dict[str, Any]:
        return {"id": "wrk_9", "deployment": "demo", "deployment_version": version, "state": state}

    routes = Routes(
        {
            "GET /v1/deployments/demo": ok(DEPLOYMENT),
            "PUT /v1/deployments/demo": ok(updated),
            "GET /v1/workers": [
                ok({"data": [w("idle", version=3)]}),
                ok({"data": [w("booting")]}),
                ok({"data": [w("loading")]}),
                ok({"data": [w("warming")]}),
                ok({"data": [w("idle")]}),
            ],
        }
    )
    result = invoke(["deploy", "--name", "demo", "--min-workers", "1", "--wait"], routes)
    assert result.exit_code == 0, result.output
    assert "updated deployment 'demo' (version 4)" in result.stdout
    assert "ready: worker wrk_9 serves 'demo' version 4" in result.stdout
    steps = [line.rsplit(": ", 1)[1] for line in result.stderr.splitlines()]
    assert steps == ["waiting for a worker to start", "booting", "loading", "warming", "idle"]


def test_deploy_wait_with_min_workers_0_warns_and_returns() -> None:
    routes = Routes({"GET /v1/deployments/demo": ok(DEPLOYMENT)})
    result = invoke(["deploy", "--name", "demo", "--wait"], routes)
    assert result.exit_code == 0, result.output
    assert "min_workers 0" in result.stderr and "not waiting" in result.stderr
    assert routes.called() == ["GET /v1/deployments/demo"]


def test_deploy_wait_reports_a_failed_worker_and_exits_2() -> None:
    failed = {"id": "wrk_9", "deployment_version": 1, "state": "failed", "reason": "ObjectNotFound"}
    routes = Routes(
        {
            "GET /v1/deployments/demo": not_found(),
            "POST /v1/deployments": ok({**DEPLOYMENT, "min_workers": 1, "version": 1}, 201),
            "GET /v1/workers": [ok({"data": []}), ok({"data": [failed]})],
        }
    )
    args = ["deploy", "--name", "demo", "--model", "s3://m/d/", "--min-workers", "1", "--wait"]
    result = invoke(args, routes)
    assert result.exit_code == 2
    assert "wrk_9 failed: ObjectNotFound" in result.stderr


# --- models verify --------------------------------------------------------------------------


def test_models_verify_execs_the_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_execv(path: str, args: list[str]) -> None:
        calls.append(args)
        raise SystemExit(0)

    monkeypatch.setattr(models_cli, "_loader_main_exists", lambda: True)
    monkeypatch.setattr(os, "execv", fake_execv)
    result = invoke(["models", "verify", "s3://models/demo/", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert calls == [[sys.executable, "-m", "loader", "s3://models/demo/", "--device", "cpu"]]


def test_models_verify_without_the_loader_cli_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models_cli, "_loader_main_exists", lambda: False)
    result = invoke(["models", "verify", "s3://models/demo/"])
    assert result.exit_code == 1 and "python -m loader" in result.stderr

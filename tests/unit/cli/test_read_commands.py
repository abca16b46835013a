"""The commands that read: deployments list, jobs get and jobs watch, billing records, status
(queues, workers and the scaling decision of each deployment), plain and `--json`."""

from __future__ import annotations

import json

import httpx

from tests.unit.cli.mock_api import DEPLOYMENT, Routes, invoke, job, ok


def test_deployments_list_plain_and_json() -> None:
    routes = Routes({"GET /v1/deployments": httpx.Response(200, json={"data": [DEPLOYMENT]})})
    result = invoke(["deployments", "list"], routes)
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()
    assert header.split("\t")[0] == "name"
    assert row.split("\t") == ["demo", "3", "s3://models/demo/", "cpu", "0", "1", "busy=2 idle=1"]

    result = invoke(["deployments", "list", "--json"], routes)
    assert json.loads(result.stdout) == [DEPLOYMENT]


def test_jobs_get_shows_metadata_but_not_the_text() -> None:
    job = {
        "id": "job_1",
        "deployment": "demo",
        "status": "succeeded",
        "input": {"prompt": "my secret prompt"},
        "output": {"text": "my secret answer", "finish_reason": "stop"},
        "usage": {"prompt_tokens": 3, "generated_tokens": 4},
    }
    routes = Routes({"GET /v1/jobs/job_1": httpx.Response(200, json=job)})
    result = invoke(["jobs", "get", "job_1"], routes)
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.stdout and "16 chars (stop)" in result.stdout
    assert "secret" not in result.stdout
    assert json.loads(invoke(["jobs", "get", "job_1", "--json"], routes).stdout) == job


def test_billing_records_total_is_exact() -> None:
    records = [
        {"worker_id": "wrk_1", "phase": "busy", "seconds": "1.000", "amount": "0.100000"},
        {"worker_id": "wrk_1", "phase": "idle", "seconds": "2.000", "amount": "0.200000"},
    ]
    routes = Routes({"GET /v1/billing/records": httpx.Response(200, json={"data": records})})
    result = invoke(["billing", "records", "--deployment", "demo"], routes)
    assert result.exit_code == 0, result.output
    assert "total: 0.300000 USD over 2 records" in result.stdout
    assert routes.requests[0].url.params["deployment"] == "demo"


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

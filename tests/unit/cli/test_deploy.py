"""`platform deploy` against the platform: dry runs, create or update (only what changed), the
diff it shows, and `--wait` following the new version's worker until it is ready."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from sdk.cli.manifest import diff_specs
from tests.unit.cli.mock_api import DEPLOYMENT, Routes, invoke, not_found, ok, write


def test_dry_run_shows_the_changes_and_changes_nothing(tmp_path: Path) -> None:
    manifest = write(tmp_path, "name: demo\nmodel: s3://models/demo/\nmax_workers: 4\n")
    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
            "PUT /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
        }
    )
    result = invoke(["deploy", str(manifest), "--max-tokens", "32", "--dry-run"], routes)
    assert result.exit_code == 0, result.output
    assert "update deployment 'demo' (version 3)" in result.stdout
    assert "~ max_workers: 1 -> 4" in result.stdout
    assert "~ defaults.max_tokens: 64 -> 32" in result.stdout
    assert "dry run: the platform accepts it; nothing changed" in result.stdout
    # the platform checked the new spec, as a dry run
    assert routes.called() == ["GET /v1/deployments/demo", "PUT /v1/deployments/demo"]
    (put,) = [r for r in routes.requests if r.method == "PUT"]
    assert put.url.params["dry_run"] == "true"
    assert routes.body("PUT /v1/deployments/demo")["max_workers"] == 4


def test_dry_run_of_a_new_deployment() -> None:
    routes = Routes(
        {
            "GET /v1/deployments/demo": not_found(),
            "POST /v1/deployments": httpx.Response(200, json={**DEPLOYMENT, "version": 1}),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--model", "s3://m/d/", "--dry-run"], routes)
    assert result.exit_code == 0, result.output
    assert "create deployment 'demo'" in result.stdout
    assert "+ model: 's3://m/d/'" in result.stdout
    assert routes.called() == ["GET /v1/deployments/demo", "POST /v1/deployments"]
    assert routes.requests[-1].url.params["dry_run"] == "true"


def test_a_dry_run_the_platform_refuses_says_why_and_fails() -> None:
    problem = {
        "title": "Unprocessable Entity",
        "status": 422,
        "detail": "model 's3://m/d/': config.json: not found",
    }
    routes = Routes(
        {
            "GET /v1/deployments/demo": not_found(),
            "POST /v1/deployments": httpx.Response(
                422, json=problem, headers={"content-type": "application/problem+json"}
            ),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--model", "s3://m/d/", "--dry-run"], routes)
    assert result.exit_code != 0
    assert "config.json: not found" in result.stderr
    assert "dry run: the platform accepts it" not in result.stdout


def test_deploy_creates_when_missing_and_updates_when_present(tmp_path: Path) -> None:
    manifest = write(tmp_path, "name: demo\nmodel: s3://m/d/\naccelerator: cpu\n")
    created = {**DEPLOYMENT, "version": 1}
    routes = Routes(
        {
            "GET /v1/deployments/demo": not_found(),
            "POST /v1/deployments": httpx.Response(201, json=created),
        }
    )
    result = invoke(["deploy", str(manifest), "--max-workers", "2"], routes)
    assert result.exit_code == 0, result.output
    assert routes.body("POST /v1/deployments") == {
        "name": "demo",
        "model": "s3://m/d/",
        "accelerator": "cpu",
        "max_workers": 2,
    }
    assert "created deployment 'demo' (version 1)" in result.stdout

    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
            "PUT /v1/deployments/demo": httpx.Response(200, json={**DEPLOYMENT, "version": 4}),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--max-workers", "2"], routes)
    assert result.exit_code == 0, result.output
    sent = routes.body("PUT /v1/deployments/demo")
    assert sent["max_workers"] == 2 and sent["model"] == DEPLOYMENT["model"]  # the rest is kept
    assert "version" not in sent and "workers" not in sent
    assert "updated deployment 'demo' (version 4)" in result.stdout


def test_deploy_without_changes_sends_nothing() -> None:
    routes = Routes({"GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT)})
    result = invoke(["deploy", "--name", "demo", "--max-workers", "1"], routes)
    assert result.exit_code == 0
    assert "is up to date (version 3)" in result.stdout
    assert routes.called() == ["GET /v1/deployments/demo"]


def test_queue_wait_is_set_by_flag_or_manifest_and_zero_is_accepted(tmp_path: Path) -> None:
    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
            "PUT /v1/deployments/demo": httpx.Response(200, json={**DEPLOYMENT, "version": 4}),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--queue-wait", "0"], routes)
    assert result.exit_code == 0, result.output
    assert "+ queue_wait_s: 0.0" in result.stdout
    assert routes.body("PUT /v1/deployments/demo")["queue_wait_s"] == 0

    current = {**DEPLOYMENT, "queue_wait_s": 2.0}
    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=current),
            "PUT /v1/deployments/demo": httpx.Response(200, json={**current, "version": 4}),
        }
    )
    manifest = write(tmp_path, "name: demo\nqueue_wait_s: 5\n")
    result = invoke(["deploy", str(manifest)], routes)
    assert result.exit_code == 0, result.output
    assert "~ queue_wait_s: 2.0 -> 5" in result.stdout
    assert routes.body("PUT /v1/deployments/demo")["queue_wait_s"] == 5


def test_diff_lines() -> None:
    assert diff_specs({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": "x"}) == ["~ b: 2 -> 3", "+ c: 'x'"]
    old = {"defaults": {"max_tokens": 64, "seed": 1}}
    new = {"defaults": {"max_tokens": 64, "top_p": 0.9}}
    assert diff_specs(old, new) == ["- defaults.seed: 1", "+ defaults.top_p: 0.9"]


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


def test_the_engine_is_set_by_flag_and_a_wrong_one_is_refused_locally() -> None:
    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
            "PUT /v1/deployments/demo": httpx.Response(200, json={**DEPLOYMENT, "version": 4}),
        }
    )
    args = ["deploy", "--name", "demo", "--engine", "vllm", "--accelerator-count", "2"]
    result = invoke(args, routes)
    assert result.exit_code == 0, result.output
    assert "+ engine: 'vllm'" in result.stdout
    sent = routes.body("PUT /v1/deployments/demo")
    assert (sent["engine"], sent["accelerator_count"]) == ("vllm", 2)

    routes = Routes({})
    result = invoke(["deploy", "--name", "demo", "--engine", "tgi"], routes)
    assert result.exit_code == 1
    assert "--engine: engine: must be one of auto, builtin, vllm, got 'tgi'" in result.stderr
    assert routes.requests == []

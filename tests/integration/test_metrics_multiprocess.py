"""Two API processes writing their metrics into one PROMETHEUS_MULTIPROC_DIR (as the embedded
supervisor runs them): a scrape of either shows the jobs both ended and the requests both
answered, and the state families (derived from SQL and Redis by the answering process) once.

Real processes: uvicorn serving `create_app` on two loopback ports, on the real Redis and a
SQLite database they share; the reconciler in this process starts the worker (recording
provider), the test plays the worker through the internal endpoints of both."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from control_plane.embedded.processes import free_port
from control_plane.providers.local import die_with_parent
from control_plane.reconcile.driver import Reconciler
from control_plane.settings import Settings
from tests.integration.api_helpers import SPEC, WORKER, WORKER_TOKEN, h
from tests.integration.conftest import provider

SERVE = """
import sys, uvicorn
from control_plane.api.app import create_app
from control_plane.settings import Settings
uvicorn.run(create_app(Settings()), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@pytest.fixture
def api_pair(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """Two API processes sharing one multiprocess directory: (url A, url B, the directory)."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {
        **os.environ,
        "PLATFORM_DATABASE_URL": settings.database_url,
        "PLATFORM_REDIS_URL": settings.redis_url,
        "PLATFORM_WORKER_TOKEN": WORKER_TOKEN,
        "PLATFORM_VALIDATE_MODELS": "false",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SERVE, str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"api-{port}.log", "wb"),  # noqa: SIM115
            preexec_fn=die_with_parent,
        )
        for port in ports
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url, proc in zip(urls, procs, strict=True):
            _wait_ready(url, proc)
        yield urls[0], urls[1], metrics_dir
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the API process at {url} exited ({proc.returncode})"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the API process at {url} did not start")


def scrape(url: str, key: str) -> list[tuple[str, dict[str, str], float]]:
    r = httpx.get(f"{url}/metrics", headers=h(key), timeout=30)
    assert r.status_code == 200, r.text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    ]


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(
        v for n, lb, v in samples if n == name and all(lb.get(k) == x for k, x in labels.items())
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_two_api_processes_export_each_others_events_and_the_state_once(
    api_pair: tuple[str, str, Path], keys: dict[str, str], loop: Reconciler
) -> None:
    a, b, metrics_dir = api_pair
    key = keys["a"]
    assert httpx.post(f"{a}/v1/deployments", json=SPEC, headers=h(key)).status_code == 201
    jobs = []
    for _ in range(2):
        r = httpx.post(
            f"{a}/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(key)
        )
        assert r.status_code == 202, r.text
        jobs.append(r.json()["id"])
    loop.tick(datetime.now(UTC))
    wid = provider(loop).started[-1].worker_id
    for state in ("loading", "warming", "idle"):
        body = {"state": state, "at": time.time()}
        assert httpx.post(f"{a}/internal/workers/{wid}/state", json=body, headers=WORKER).is_success
    # one job ends through each process
    for jid, url in zip(jobs, (a, b), strict=True):
        claim = httpx.post(
            f"{url}/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER
        )
        assert claim.status_code == 200, claim.text
        report = {"worker_id": wid, "attempt": claim.json()["attempt"], "status": "succeeded",
                  "output": {"text": "t", "timings": {"ttft_s": 0.1}}}  # fmt: skip
        r = httpx.post(f"{url}/internal/jobs/{jid}/complete", json=report, headers=WORKER)
        assert r.status_code == 200, r.text
    loop.tick(
        datetime.now(UTC)
    )  # its jobs ended: idle again (services.workers.worker_records.settle_idle)

    assert len([p for p in metrics_dir.iterdir() if p.name.startswith("counter_")]) == 2
    complete = {"method": "POST", "route": "/internal/jobs/{job_id}/complete", "status": "200"}
    for url in (a, b):
        m = scrape(url, key)
        # the events of both processes, summed
        assert total(m, "platform_jobs_ended_total", deployment="demo", status="succeeded") == 2
        assert total(m, "platform_job_time_to_first_token_seconds_count", deployment="demo") == 2
        assert total(m, "platform_http_requests_total", **complete) == 2
        # the state, once: from the database and Redis, by the process that answered
        assert [n for n, _, _ in m].count("platform_billing_drift_issues") == 1
        assert total(m, "platform_workers", state="idle", accelerator="cpu") == 1
        assert total(m, "platform_jobs_active", deployment="demo", status="running") == 0

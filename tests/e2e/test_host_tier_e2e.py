"""Cold starts and the host-memory weight tier on the embedded platform (real processes): a
streamed run reports its cold start's phases, a serving worker fills the host tier (even when
scaled down during its first jobs) and the next worker of the same model reads from it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sdk import Client
from tests.e2e.conftest import cli, processes_mentioning

pytestmark = pytest.mark.e2e


def test_a_cold_start_reports_its_phases_and_the_next_worker_reads_the_host_tier(
    platform: dict[str, Any], demo_model: Path
) -> None:
    from sdk import RunStatus

    env = platform["env"]
    up = cli("models", "upload", str(demo_model), "models/tiers/", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name="tier-a", model="store://models/tiers/")
    seen: list[RunStatus] = []
    stream = client.run(
        "tier-a", {"prompt": "Hi", "max_tokens": 4}, stream=True, on_status=seen.append
    )
    "".join(stream)
    assert stream.job is not None and stream.job.status == "succeeded"
    statuses = [(s.status, s.phase) for s in seen]
    assert statuses[0] == ("queued", None) and statuses[-1] == ("running", None)
    # a worker boots for it, or the warm pool's worker is given to it
    assert statuses[1] in {("starting", "booting"), ("starting", "assigning_warm_worker")}
    assert all(s.status == "starting" for s in seen[1:-1])

    # once serving, the first worker fills host memory (off its cold start's path) ...
    from loader import cached_uris

    def in_host_tier() -> bool:
        return any("/models/tiers/" in u for u in cached_uris(str(tier_dir)))

    tier_dir = platform["state_dir"] / "host-cache"
    deadline = time.monotonic() + 60
    while not in_host_tier():
        assert time.monotonic() < deadline, "the host tier was never filled"
        time.sleep(0.2)
    # ... and another deployment of the same model reads its weights from there
    client.deployments.create(name="tier-b", model="store://models/tiers/")
    assert client.run("tier-b", {"prompt": "Hi", "max_tokens": 4}) is not None
    (worker,) = client.workers.list(deployment="tier-b")
    log = (platform["state_dir"] / "logs" / "workers" / f"{worker['id']}.log").read_text()
    assert "cache hits {'host': 1}" in log, log[-2000:]
    for name in ("tier-a", "tier-b"):
        client.deployments.delete(name)


def test_a_worker_scaled_down_during_its_first_jobs_still_fills_the_host_tier(
    platform: dict[str, Any], demo_model: Path
) -> None:
    """Asked to drain (SIGTERM, as a scale-down does) while its first jobs run (the fill waits
    for quiet): the worker finishes them, reports stopped (its tenant's records end there),
    then finishes the fill before it exits."""
    from loader import cached_uris

    up = cli("models", "upload", str(demo_model), "models/fill-exit/", env=platform["env"])
    assert up.returncode == 0, up.stdout + up.stderr
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(
        name="fill-exit", model="store://models/fill-exit/", max_workers=1, target_concurrency=4
    )
    # the untrained demo model generates every one of its max_tokens: four long jobs, together
    jobs = [client.submit("fill-exit", {"prompt": "Hi", "max_tokens": 400}) for _ in range(4)]
    deadline = time.monotonic() + 90
    while any(client.jobs.get(j.id).status != "running" for j in jobs):
        assert time.monotonic() < deadline, "the jobs never ran together"
        time.sleep(0.02)
    (worker,) = client.workers.list(deployment="fill-exit")
    (proc,) = processes_mentioning(worker["id"])
    os.kill(int(proc.split(":", 1)[0]), signal.SIGTERM)  # what the provider's stop sends
    assert all(j.wait(timeout=60).status == "succeeded" for j in jobs), "the drain ran them"

    tier_dir = platform["state_dir"] / "host-cache"
    deadline = time.monotonic() + 60
    while not any("/models/fill-exit/" in u for u in cached_uris(str(tier_dir))):
        assert time.monotonic() < deadline, "the host tier was never filled"
        time.sleep(0.2)
    log_path = platform["state_dir"] / "logs" / "workers" / f"{worker['id']}.log"
    log = log_path.read_text()
    assert "finishing the cache-tier fill before exiting" in log, log[-2000:]
    # the fill came after `stopped`: the tenant's records end before it
    # (the deployment lives on: the autoscaler may have started another worker meanwhile)
    (stopped,) = (w for w in client.workers.list(deployment="fill-exit") if w["id"] == worker["id"])
    assert stopped["state"] == "stopped"
    records = client.billing.records(worker_id=worker["id"])
    assert records[-1]["phase"] == "drain" and records[-1]["end"] == stopped["stopped_at"]
    client.deployments.delete("fill-exit")

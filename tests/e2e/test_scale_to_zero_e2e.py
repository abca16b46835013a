"""Long jobs while a deployment scales down to zero (real processes): a worker asked to stop
drains — it finishes every job it holds before it exits — so none is killed, none re-run,
none lost, and the deployment ends with no worker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sdk import Client
from tests.e2e.conftest import cli

JOBS = 100


def test_long_jobs_in_flight_while_the_deployment_scales_to_zero_are_neither_killed_nor_lost(
    platform: dict[str, Any], demo_model: Path
) -> None:
    up = cli("models", "upload", str(demo_model), "models/drain/", env=platform["env"])
    assert up.returncode == 0, up.stdout + up.stderr
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(
        name="drain",
        model="store://models/drain/",
        max_workers=2,
        target_concurrency=8,
        scaledown_window_s=2,
    )
    # the untrained demo model generates every one of its max_tokens: long jobs
    jobs = [client.submit("drain", {"prompt": f"job {i}", "max_tokens": 32}) for i in range(JOBS)]
    ended = [job.wait(timeout=600) for job in jobs]
    assert [j.status for j in ended] == ["succeeded"] * JOBS
    # each ran once: no worker died or was killed under it
    assert {j.attempt for j in ended} == {1}

    deadline = time.monotonic() + 60
    while any(w["state"] not in ("stopped", "failed") for w in client.workers.list("drain")):
        assert time.monotonic() < deadline, "did not scale to zero"
        time.sleep(0.3)
    workers = client.workers.list("drain")
    # every worker left by draining (exit 0), none by a kill or a crash
    assert workers and [w["state"] for w in workers] == ["stopped"] * len(workers), workers
    client.deployments.delete("drain")

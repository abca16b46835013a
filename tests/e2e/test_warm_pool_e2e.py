"""The warm pool on the embedded platform (real processes; `platform up` keeps one pool worker):
a call at zero is served by the pool worker, with no process booting for it; a pool worker
killed right after its assignment is replaced and the job completes."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from sqlalchemy import select

from control_plane.db.models import Worker
from control_plane.db.session import make_engine, make_sessionmaker
from sdk import Client
from tests.e2e.conftest import cli
from tests.helpers import wait_for


class Workers:
    """Read-only view of the platform's worker rows (the pool belongs to no tenant's API)."""

    def __init__(self, database_url: str) -> None:
        self._sessions = make_sessionmaker(make_engine(database_url))

    def get(self, worker_id: str) -> Worker | None:
        with self._sessions() as s:
            return s.get(Worker, worker_id)

    def idle_pool_worker(self) -> Worker | None:
        with self._sessions() as s:
            return s.scalars(
                select(Worker).where(Worker.deployment_id.is_(None), Worker.state == "idle")
            ).first()


def upload(platform: dict[str, Any], model: Path, path: str) -> None:
    up = cli("models", "upload", str(model), path, env=platform["env"])
    assert up.returncode == 0, up.stdout + up.stderr


def test_a_call_at_zero_is_served_by_the_warm_pool_worker(
    platform: dict[str, Any], demo_model: Path
) -> None:
    from sdk import RunStatus

    upload(platform, demo_model, "models/pool/")
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name="pool-a", model="store://models/pool/")
    rows = Workers(platform["database_url"])
    pooled = wait_for(rows.idle_pool_worker, 90, every_s=0.1, what="an idle pool worker")
    seen: list[RunStatus] = []
    stream = client.run(
        "pool-a", {"prompt": "Hi", "max_tokens": 4}, stream=True, on_status=seen.append
    )
    "".join(stream)
    assert stream.job is not None and stream.job.status == "succeeded"
    # the pool worker served it: no process booted for this call
    (worker,) = client.workers.list(deployment="pool-a")
    assert worker["id"] == pooled.id
    phases = [s.phase for s in seen if s.status == "starting"]
    assert phases and phases[0] == "assigning_warm_worker", phases
    assert "booting" not in phases
    # the tenant pays from the assignment: no boot, no pool seconds on its bill
    billed = {r["phase"] for r in client.billing.records(worker_id=pooled.id)}
    assert billed and not billed & {"boot", "pool"}, billed
    log = (platform["state_dir"] / "logs" / "workers" / f"{pooled.id}.log").read_text()
    assert "in the warm pool" in log and "assigned to deployment" in log, log[-2000:]
    client.deployments.delete("pool-a")


def test_a_pool_worker_killed_after_its_assignment_is_replaced_and_the_job_completes(
    platform: dict[str, Any], demo_model: Path
) -> None:
    upload(platform, demo_model, "models/pool-k/")
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name="pool-k", model="store://models/pool-k/")
    rows = Workers(platform["database_url"])
    pooled = wait_for(rows.idle_pool_worker, 90, every_s=0.1, what="an idle pool worker")
    job = client.submit("pool-k", {"prompt": "Hi", "max_tokens": 4})

    def assigned() -> Worker | None:
        w = rows.get(pooled.id)
        return w if w is not None and w.deployment_id is not None else None

    w = wait_for(assigned, 90, every_s=0.01, what="the assignment")
    assert w.pid is not None
    os.kill(w.pid, signal.SIGKILL)
    done = job.wait(timeout=180)
    assert done.status == "succeeded", done
    killed = rows.get(pooled.id)
    assert killed is not None and killed.state == "failed"
    served = {x["id"] for x in client.workers.list(deployment="pool-k") if x["state"] != "failed"}
    assert served and pooled.id not in served
    client.deployments.delete("pool-k")

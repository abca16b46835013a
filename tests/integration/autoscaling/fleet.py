"""The live autoscaler's test harness: a frozen clock the tests move (`FrozenClock`: arrival gaps
and tick times are exact, so a periodic pattern is exactly periodic), and `Fleet`, which plays
the workers the reconciler starts (boot in BOOT_S, claim, complete, drain when stopped) through
`/internal`, as real workers report, on real Redis and SQL, through the real API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from common.protocol import (
    worker_heartbeat_key,
)
from control_plane.db.models import Deployment, Job, Worker
from control_plane.reconcile.driver import Reconciler
from tests.integration.api_helpers import WORKER, h, submit
from tests.integration.conftest import SteppedClock, provider

BOOT_S = 2.0  # every worker Fleet plays is ready this long after its start
TICK_S = 2.0  # the reconciler's tick in these tests (the production default is 0.5 s)


class FrozenClock(SteppedClock):
    """Time moves only when the test moves it (SteppedClock adds real time too)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.start + self.offset


@dataclass
class Fleet:
    """The API, the reconciler and the workers its provider "started", on one clock."""

    client: TestClient
    loop: Reconciler
    clock: SteppedClock
    redis: redis.Redis
    key: str
    # worker id → ids of the jobs it holds
    holding: dict[str, set[str]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)

    def submit(self, **body: Any) -> str:
        return submit(self.client, self.key, **body)

    def tick(self, seconds: float = 0.0) -> None:
        """Move time, let workers due report, refit what is due (the refresher thread's work,
        done here in step), then run one reconciler tick."""
        now = self.clock.advance(seconds)
        self.play()
        self.loop.refresher.refresh(now)
        self.loop.tick(now)
        self.play()

    def play(self) -> None:
        """Workers booted BOOT_S after their start become idle; stopped ones drain, and stop
        once they hold no job."""
        now = self.clock()
        stopped = set(provider(self.loop).stopped)
        for wid, w in self.workers().items():
            if w.state == "booting" and now >= w.started_at + timedelta(seconds=BOOT_S):
                t0 = w.started_at.timestamp()
                for state, at in (("loading", 0.2), ("warming", 0.6), ("idle", 1.0)):
                    self.report(wid, state, t0 + at * BOOT_S)
                beat = json.dumps({"at": now.timestamp()})
                self.redis.set(worker_heartbeat_key(wid), beat, ex=3600)
                w.state = "idle"
            if wid in stopped and w.state in ("idle", "busy"):
                self.report(wid, "draining")  # SIGTERM: stop taking work
                w.state = "draining"
            if w.state == "draining" and not self.holding.get(wid):
                self.report(wid, "stopped")

    def workers(self) -> dict[str, Worker]:
        with self.loop.sessions() as s:
            return {w.id: w for w in s.scalars(select(Worker).order_by(Worker.started_at))}

    def live(self) -> list[Worker]:
        return [w for w in self.workers().values() if w.state not in ("stopped", "failed")]

    def idle_worker(self) -> str | None:
        stopped = set(provider(self.loop).stopped)
        return next((w.id for w in self.live() if w.state == "idle" and w.id not in stopped), None)

    def report(self, wid: str, state: str, at: float | None = None) -> None:
        body = {"state": state, "at": self.clock().timestamp() if at is None else at}
        r = self.client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER)
        assert r.status_code == 200, r.text

    def claim(self, job_id: str, wid: str) -> None:
        if not self.holding.get(wid):
            self.report(wid, "busy")
        r = self.client.post(
            f"/internal/jobs/{job_id}/claim", json={"worker_id": wid}, headers=WORKER
        )
        assert r.status_code == 200, r.text
        self.attempts[job_id] = r.json()["attempt"]
        self.holding.setdefault(wid, set()).add(job_id)

    def complete(self, job_id: str) -> None:
        [wid] = [w for w, held in self.holding.items() if job_id in held]
        body = {
            "worker_id": wid,
            "attempt": self.attempts[job_id],
            "status": "succeeded",
            "output": {"text": "ok"},
            "prompt_tokens": 1,
            "generated_tokens": 1,
        }
        r = self.client.post(f"/internal/jobs/{job_id}/complete", json=body, headers=WORKER)
        assert r.status_code == 200, r.text
        self.holding[wid].discard(job_id)
        if not self.holding[wid] and self.workers()[wid].state == "busy":
            self.report(wid, "idle")
        self.play()

    def job(self, job_id: str) -> Job:
        with self.loop.sessions() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job

    def scaling(self) -> dict[str, Any]:
        r = self.client.get("/v1/deployments/demo", headers=h(self.key))
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()["scaling"]
        return body


def deployment_id(fleet: Fleet) -> str:
    with fleet.loop.sessions() as s:
        dep = s.scalars(select(Deployment).where(Deployment.name == "demo")).one()
        return dep.id


# --- the reconciler -------------------------------------------------------------------------

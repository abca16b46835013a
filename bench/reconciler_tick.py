"""The reconciler's tick at scale: 1,000 live deployments and 10,000 pending jobs.

    .venv/bin/python bench/reconciler_tick.py                 # ~1 min
    .venv/bin/python bench/reconciler_tick.py --deployments 200 --jobs 2000 --ticks 5

A real redis-server and a SQLite database (migrated as the platform does), rows created
directly: one tenant, `--deployments` deployments (scale to zero, max 2 workers) and `--jobs`
queued jobs spread over them with their wake-ups sent. The reconciler is the platform's own
(`Reconciler.tick`), with a provider that records the workers it is asked to start and stop
instead of starting processes (this bench only measures the control plane). The first tick
places a worker for every deployment; the next ones find them booting, as on a busy platform.
Prints every tick's duration and, last, a JSON line with the median of the ticks after the
first (`tick_ms`), which `bench/control_plane.py` reports as `tick_ms_1000_deployments`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class RecordingProvider:
    """Records start, stop and kill requests; no process is started (this bench, and the
    reconciler tests, which also script the exits the next reap reports)."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.stopped: list[str] = []
        self.killed: list[str] = []
        self.exits: list[Any] = []  # what the next reap reports (a test's process deaths)
        self.held: dict[str, str] = {}  # what `waiting` reports (a test's pods without a node)

    def start(self, spec: Any) -> int | None:
        self.started.append(spec)
        return None

    def stop(self, worker_id: str) -> None:
        self.stopped.append(worker_id)

    def kill(self, worker_id: str) -> None:
        self.killed.append(worker_id)

    def waiting(self) -> dict[str, str]:
        return dict(self.held)

    def reap(self) -> list[Any]:
        out, self.exits = self.exits, []
        return out

    def shutdown(self, timeout_s: float) -> list[Any]:
        return []

    def logs(self, worker_id: str, since: datetime | None, follow: bool) -> Any:
        return iter(())

    def step_down(self) -> None:
        self.stepped_down = True


def populate(database_url: str, deployments: int, jobs: int, now: datetime, first: int = 0) -> None:
    """One tenant, its deployments and queued jobs, inserted in bulk; with `first`, more of
    them (numbered from `first`) next to those of an earlier call."""
    from sqlalchemy import insert

    from control_plane.db.models import Deployment, DeploymentVersion, Job, Tenant
    from control_plane.db.session import make_engine

    engine = make_engine(database_url)
    tenant = "ten_bench"
    deps = [
        {
            "id": f"dep_{i + first:06d}",
            "tenant_id": tenant,
            "name": f"d{i + first}",
            "version": 1,
            # the column's name (a Core insert): the ORM attribute is `spec_doc`
            "spec": {
                "name": f"d{i + first}",
                "model": f"store://models/d{i + first}/",
                "max_workers": 2,
            },
            "created_at": now,
            "updated_at": now,
        }
        for i in range(deployments)
    ]
    with engine.begin() as conn:
        if first == 0:
            conn.execute(
                insert(Tenant),
                [{"id": tenant, "name": "bench", "webhook_secret": "whsec_x", "created_at": now}],
            )
        conn.execute(insert(Deployment), deps)
        conn.execute(
            insert(DeploymentVersion),
            [
                {"deployment_id": d["id"], "version": 1, "spec": d["spec"], "created_at": now}
                for d in deps
            ],
        )
        rows = [
            {
                "id": f"job_{first:06d}_{k:08d}",
                "tenant_id": tenant,
                "deployment_id": deps[k % deployments]["id"],
                "deployment_name": deps[k % deployments]["name"],
                "deployment_version": 1,
                "kind": "async",
                "status": "queued",
                "input": {"prompt": "x", "max_tokens": 1},
                "attempt": 0,
                "webhook_status": "none",
                "dispatched_at": now,
                "created_at": now - timedelta(milliseconds=jobs - k),
            }
            for k in range(jobs)
        ]
        for i in range(0, len(rows), 2000):
            conn.execute(insert(Job), rows[i : i + 2000])
    engine.dispose()


def measure(
    deployments: int, jobs: int, ticks: int, database_url: str | None = None
) -> dict[str, Any]:
    """The reconciler's tick over `deployments` and `jobs` pending jobs, on a fresh SQLite file
    or on `database_url` (an empty database, migrated here)."""
    import redis

    from control_plane.db.migrate import upgrade
    from control_plane.db.session import make_engine, make_sessionmaker
    from control_plane.embedded.processes import free_port, start_redis
    from control_plane.reconcile.driver import Reconciler, tune_gc
    from control_plane.reconcile.env import Env
    from control_plane.services.jobs.dispatch import dispatch_job, make_celery
    from control_plane.settings import Settings

    with tempfile.TemporaryDirectory(prefix="bench-tick-") as tmp:
        work = Path(tmp)
        server = start_redis(work / "redis", free_port(), work / "redis.log", appendonly=False)
        try:
            url = server.extra["url"]
            database_url = database_url or f"sqlite:///{work / 'platform.db'}"
            upgrade(database_url)
            now = datetime.now(UTC)
            populate(database_url, deployments, jobs, now)
            r = redis.Redis.from_url(url)
            for k in range(jobs):  # their wake-ups wait in the queues, as after admission
                dispatch_job(r, f"dep_{k % deployments:06d}", f"job_{0:06d}_{k:08d}", "async")
            settings = Settings(
                database_url=database_url,
                redis_url=url,
                state_dir=work / "state",
                warm_pool_max=0,
            )
            provider = RecordingProvider()
            tune_gc()  # as the reconciler process does after its start
            loop = Reconciler(
                Env(settings, r, make_celery(settings), provider),
                make_sessionmaker(engine := make_engine(database_url)),
            )
            durations: list[float] = []
            for i in range(ticks):
                at = now + timedelta(seconds=1 + i)
                t0 = time.perf_counter()
                loop.tick(at)
                durations.append((time.perf_counter() - t0) * 1000)
                print(
                    f"  tick {i}: {durations[-1]:7.1f} ms"
                    f"  (workers started so far: {len(provider.started)})",
                    flush=True,
                )
            r.close()
            engine.dispose()
        finally:
            server.stop()
    return {
        "deployments": deployments,
        "jobs": jobs,
        "first_tick_ms": round(durations[0], 1),
        "tick_ms": round(statistics.median(durations[1:]), 1),
        "tick_ms_max": round(max(durations[1:]), 1),
        "workers_started": len(provider.started),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--deployments", type=int, default=1000)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--ticks", type=int, default=6, help="ticks measured (the first included)")
    args = p.parse_args()
    result = measure(args.deployments, args.jobs, max(2, args.ticks))
    print(json.dumps({"bench": "reconciler_tick", **result}))


if __name__ == "__main__":
    main()

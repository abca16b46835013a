"""One embedded platform under test: started with the bench's environment, the demo model
deployed on one warm worker, measured (admissions; with `full`, the warm path, SSE, deploys and
a batch too), then stopped; and the PostgreSQL server `--postgres` runs it on."""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.controlplane.load import hammer
from bench.controlplane.warm import sse, warm_path
from bench.cpu_share import Share

CLIENTS = (1, 16, 64)
# The tenant's quotas (600 requests/min by default) would measure the rate limiter instead.
PLATFORM_ENV = {
    "PLATFORM_WARM_POOL_MAX": "0",
    "PLATFORM_DEFAULT_REQUESTS_PER_MIN": str(10**9),
    "PLATFORM_DEFAULT_TOKENS_PER_MIN": str(10**9),
    "PLATFORM_DEFAULT_MAX_IN_FLIGHT": str(10**6),
}
TERMINAL = {"succeeded", "failed", "canceled", "expired", "timed_out"}


@contextlib.contextmanager
def postgres() -> Iterator[Callable[[], contextlib.AbstractContextManager[str]]]:
    """A PostgreSQL server for the run; yields a maker of fresh databases (dropped after)."""
    from tests.fixtures_postgres import fresh_database, postgres_bindir, start_postgres

    if postgres_bindir() is None:
        raise SystemExit("--postgres needs PostgreSQL: apt-get install postgresql")
    # Not under the private temporary directory: the server runs as the `postgres` user.
    root = Path(tempfile.mkdtemp(prefix="bench-cp-pg-"))
    root.chmod(0o755)
    proc, server = start_postgres(root / "pg")
    try:
        yield lambda: contextlib.contextmanager(fresh_database)(server)
    finally:
        proc.stop()
        shutil.rmtree(root, ignore_errors=True)


def on_platform(
    state: Path, env: dict[str, str], demo: Any, args: argparse.Namespace, full: bool
) -> dict[str, Any]:
    """`platform up` with `env`, measured (admissions only unless `full`), then stopped."""
    import httpx

    from bench.coldstart.driver import Platform

    plat = Platform(state, env, {})
    try:
        return measure(plat, demo, args, httpx, full)
    finally:
        plat.close()


def measure(
    plat: Any, demo: Any, args: argparse.Namespace, httpx: Any, full: bool
) -> dict[str, Any]:
    from bench.coldstart.driver import wait_for

    up = plat.upload(demo, "api")
    name = f"cp-{plat.token}"
    spec = {
        "name": name,
        "model": up.store_uri,
        "min_workers": 1,
        "max_workers": 1,
        "target_concurrency": 8,
        "accelerator": "cpu",
    }
    plat.http.post("/v1/deployments", json=spec).raise_for_status()

    def serving() -> bool | None:
        data = plat.http.get("/v1/workers", params={"deployment": name}).json()["data"]
        return True if any(w["state"] in ("idle", "busy") for w in data) else None

    wait_for("a warm worker", serving, 180)
    base, key = plat.state["url"], plat.state["api_key"]

    def client() -> Any:
        return httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120.0
        )

    body = {"input": {"prompt": "Hi", "max_tokens": 1}}
    plat.http.post(f"/v1/deployments/{name}/run", json=body).raise_for_status()  # warm the path

    def submit(c: Any, _i: int) -> Any:
        return c.post(f"/v1/deployments/{name}/jobs", json=body)

    def run(c: Any, _i: int) -> Any:
        return c.post(f"/v1/deployments/{name}/run", json=body)

    admissions: dict[str, dict[int, float]] = {"async": {}, "sync": {}}
    shares: dict[str, dict[int, Share]] = {"async": {}, "sync": {}}
    admitted: list[str] = []
    for kind, call in (("async", submit), ("sync", run)):
        for n in CLIENTS:
            ids, refused, share = hammer(client, call, n, args.seconds, args.client_processes)
            admissions[kind][n] = len(ids) / args.seconds
            admitted += ids
            print(
                f"  {kind:5s} {n:2d} clients: {len(ids) / args.seconds:7.1f} /s"
                + (f" (refused: {refused})" if refused else ""),
                flush=True,
            )
            print(f"      {share.line()}", flush=True)
            shares[kind][n] = share
            drain(plat, ids)

    lost = [j for j in admitted if plat.http.get(f"/v1/jobs/{j}").json()["status"] not in TERMINAL]
    if lost:
        raise SystemExit(f"{len(lost)} admitted jobs never finished, e.g. {lost[:3]}")
    if not full:
        return {"admissions": admissions, "admitted": len(admitted), "cpu": shares}
    overhead, stages, lean, sdk_calls = warm_path(plat, name, body, args.runs)
    first_event, first_output = sse(base, key, name, body, args.runs, httpx, leave=False)
    deploys = deploy_times(plat, up.store_uri, args.deploys)
    batch_s, batch_lag_s = batch_time(plat, name, body, args.batch_lines)
    left_event, left_output = sse(base, key, name, body, args.runs, httpx, leave=True)
    return {
        "admissions": admissions,
        "admitted": len(admitted),
        "cpu": shares,
        "overhead_ms": overhead,
        "stages_ms": stages,
        "overhead_stdlib_ms": lean,
        "overhead_sdk_ms": sdk_calls,
        "first_event_ms": first_event,
        "deploy_ms": deploys,
        "batch_lines_per_s": args.batch_lines / batch_s,
        "batch_completed_after_ms": batch_lag_s * 1000,
        "first_output_ms": first_output,
        "left_first_event_ms": left_event,
        "left_first_output_ms": left_output,
    }


def deploy_times(plat: Any, model_uri: str, n: int) -> list[float]:
    """`POST /v1/deployments` of `n` new deployments of the uploaded model (min 0 workers, so
    nothing boots): what a deploy costs the control plane, its model check included."""
    times: list[float] = []
    for i in range(n):
        spec = {"name": f"cp-{plat.token}-d{i}", "model": model_uri, "min_workers": 0,
                "max_workers": 1, "accelerator": "cpu"}  # fmt: skip
        t0 = time.perf_counter()
        plat.http.post("/v1/deployments", json=spec).raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def batch_time(plat: Any, name: str, body: dict[str, Any], lines: int) -> tuple[float, float]:
    """Seconds from `POST /v1/batches` (`lines` 1-token lines, at most 8 in flight: the
    worker's slots) until every line has ended, and from then until the batch is completed;
    polled every 20 ms."""
    from bench.coldstart.driver import wait_for

    batch = {"deployment": name, "inputs": [body["input"]] * lines, "max_in_flight": 8}
    t0 = time.perf_counter()
    created = plat.http.post("/v1/batches", json=batch)
    created.raise_for_status()
    path = f"/v1/batches/{created.json()['id']}"

    def ended() -> bool | None:
        counts = plat.http.get(path).json()["counts"]
        waiting = sum(counts[k] for k in ("queued", "starting", "running"))
        return True if waiting == 0 else None

    wait_for("the batch's lines", ended, 600, every_s=0.02)
    t_lines = time.perf_counter()

    def completed() -> bool | None:
        return True if plat.http.get(path).json()["status"] == "completed" else None

    wait_for("the batch's completion", completed, 60, every_s=0.02)
    return t_lines - t0, time.perf_counter() - t_lines


def drain(plat: Any, ids: list[str], timeout_s: float = 600.0) -> None:
    """Until the last admitted jobs are terminal (they run in order of admission, roughly)."""
    from bench.coldstart.driver import wait_for

    def done(job_id: str) -> bool | None:
        status = plat.http.get(f"/v1/jobs/{job_id}").json()["status"]
        return True if status in TERMINAL else None

    for job_id in ids[-20:]:
        wait_for(f"job {job_id}", functools.partial(done, job_id), timeout_s, every_s=0.05)

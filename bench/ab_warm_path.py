"""The warm path of two versions of the platform, measured side by side.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/ab_warm_path.py --base /tmp/base          # ~3 min

On a small shared machine, single runs of `bench/control_plane.py` vary by 25-40 % from one
minute to the next (the same commit measured 8 and 12 ms of overhead in two runs a few minutes
apart), far more than most changes it should judge. So this starts both platforms at once (the
base from its checkout: its processes run with that directory as their working directory and
`PYTHONPATH`, so `python -m ...` imports its code; the other from this checkout), each with one
warm worker and one API process (`--api-processes`), and alternates 1-token sync runs and
streamed runs between them: whatever the machine does meanwhile, both see it. It prints each
stage's p50 / p99 for both (client latency; overhead = latency minus the job's execution,
`completed_at - started_at`; accept, claim, answer as in `bench/control_plane.py`; sent ->
first SSE event, its first `output` event, its end) and, last, one JSON line with the p50
ratios of this checkout over the base.

With `--admissions N` it then alternates N rounds of 16 clients submitting async 1-token jobs
for `--seconds` each (as `bench/control_plane.py` does; each round's jobs drained before the
next) and prints both versions' admissions/s per round (and jobs/s from the round's start to its
last job's end) and their median ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STAGES = (
    "latency",
    "overhead",
    "accept",
    "claim",
    "execution",
    "answer",
    "sse_first_event",
    "sse_first_output",
    "sse_end",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", type=Path, required=True, help="a checkout of the base version")
    p.add_argument("--runs", type=int, default=250, help="sync runs (and streams) per version")
    p.add_argument("--admissions", type=int, default=0, help="rounds of async admissions")
    p.add_argument("--seconds", type=float, default=4.0, help="per round of admissions")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients per round")
    p.add_argument("--api-processes", type=int, default=1, help="API processes per platform")
    p.add_argument(
        "--postgres",
        action="store_true",
        help="both platforms on one PostgreSQL server, a database each (else SQLite each)",
    )
    p.add_argument(
        "--idempotency-keys",
        action="store_true",
        help="each sync run carries a new Idempotency-Key, as the SDK's calls do",
    )
    args = p.parse_args()

    import httpx

    from bench.coldstart.driver import Platform
    from bench.coldstart.models import build_models
    from bench.controlplane.measure import PLATFORM_ENV, postgres

    env = {**PLATFORM_ENV, "PLATFORM_API_PROCESSES": str(args.api_processes)}
    versions = {"base": args.base.resolve(), "this": REPO}
    plats: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp, contextlib.ExitStack() as dbs:
        (demo,) = build_models(Path(tmp) / "models", skip_big=True)
        database = dbs.enter_context(postgres()) if args.postgres else None
        try:
            for label, root in versions.items():
                own = dict(env)
                if database is not None:
                    own["PLATFORM_DATABASE_URL"] = dbs.enter_context(database())
                plats[label] = start(Platform, Path(tmp) / label, own, root)
            names = {label: deploy(plat, demo) for label, plat in plats.items()}
            results = alternate(plats, names, args.runs, httpx, args.idempotency_keys)
            rounds = admit(plats, names, args, httpx) if args.admissions else None
        finally:
            for plat in plats.values():
                plat.close()
    report(results, rounds)


def start(platform: Any, state: Path, env: dict[str, str], root: Path) -> Any:
    """`platform up` whose processes import the code under `root`."""
    saved_cwd, saved_path = Path.cwd(), os.environ.get("PYTHONPATH")
    os.chdir(root)  # `python -m ...` puts its working directory first on sys.path
    os.environ["PYTHONPATH"] = str(root)
    try:
        return platform(state, env, {})
    finally:
        os.chdir(saved_cwd)
        if saved_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_path


def deploy(plat: Any, demo: Any) -> str:
    """The demo model with one warm worker; returns the deployment's name once it serves."""
    from bench.coldstart.driver import wait_for

    up = plat.upload(demo, "api")
    name = f"ab-{plat.token}"
    spec = {"name": name, "model": up.store_uri, "min_workers": 1, "max_workers": 1,
            "target_concurrency": 8, "accelerator": "cpu"}  # fmt: skip
    plat.http.post("/v1/deployments", json=spec).raise_for_status()

    def serving() -> bool | None:
        data = plat.http.get("/v1/workers", params={"deployment": name}).json()["data"]
        return True if any(w["state"] in ("idle", "busy") for w in data) else None

    wait_for("a warm worker", serving, 240)
    for _ in range(5):  # warm the path
        plat.http.post(f"/v1/deployments/{name}/run", json=BODY).raise_for_status()
    return name


BODY = {"input": {"prompt": "Hi", "max_tokens": 1}}


def alternate(
    plats: dict[str, Any], names: dict[str, str], runs: int, httpx: Any, keyed: bool = False
) -> dict[str, dict[str, list[float]]]:
    from bench.coldstart.phases import parse_iso

    out: dict[str, dict[str, list[float]]] = {k: {s: [] for s in STAGES} for k in plats}
    clients = {
        label: httpx.Client(
            base_url=plat.state["url"],
            headers={"Authorization": f"Bearer {plat.state['api_key']}"},
            timeout=60,
        )
        for label, plat in plats.items()
    }
    labels = list(plats)
    for i in range(runs):
        for label in labels if i % 2 == 0 else reversed(labels):  # neither always goes first
            c, url, r = clients[label], f"/v1/deployments/{names[label]}/run", out[label]
            headers = {"Idempotency-Key": uuid.uuid4().hex} if keyed else None
            t0 = time.time()
            job = c.post(url, json=BODY, headers=headers).json()
            t1 = time.time()
            created, started, done = (
                parse_iso(job[k]) for k in ("created_at", "started_at", "completed_at")
            )
            for stage, seconds in (
                ("latency", t1 - t0),
                ("overhead", t1 - t0 - (done - started)),
                ("accept", created - t0),
                ("claim", started - created),
                ("execution", done - started),
                ("answer", t1 - done),
            ):
                r[stage].append(seconds * 1000)
            t0 = time.perf_counter()
            first = output = None
            with c.stream("POST", url, json={**BODY, "stream": True}) as resp:
                for line in resp.iter_lines():  # read to the end, as the SDK does
                    if first is None and line.startswith("event:"):
                        first = (time.perf_counter() - t0) * 1000
                    if output is None and line.startswith("event: output"):
                        output = (time.perf_counter() - t0) * 1000
            r["sse_first_event"].append(first if first is not None else float("nan"))
            r["sse_first_output"].append(output if output is not None else float("nan"))
            r["sse_end"].append((time.perf_counter() - t0) * 1000)
    for c in clients.values():
        c.close()
    return out


def admit(
    plats: dict[str, Any], names: dict[str, str], args: argparse.Namespace, httpx: Any
) -> dict[str, list[float]]:
    """Rounds of async admissions, alternating between the versions; admissions/s per round."""
    from bench.controlplane.load import hammer
    from bench.controlplane.measure import TERMINAL, drain

    out: dict[str, list[float]] = {label: [] for label in plats}
    labels = list(plats)
    for i in range(args.admissions):
        for label in labels if i % 2 == 0 else reversed(labels):
            plat, name = plats[label], names[label]

            def client(plat: Any = plat) -> Any:
                headers = {"Authorization": f"Bearer {plat.state['api_key']}"}
                return httpx.Client(base_url=plat.state["url"], headers=headers, timeout=120.0)

            def submit(c: Any, _i: int, name: str = name) -> Any:
                return c.post(f"/v1/deployments/{name}/jobs", json=BODY)

            t0 = time.monotonic()
            ids, refused, _ = hammer(client, submit, args.clients, args.seconds)
            if refused:
                raise SystemExit(f"{label}: refused {refused}")
            drain(plat, ids)
            # (on one machine the worker's execution competes with the admissions for the
            # cores: a version that runs jobs sooner admits fewer meanwhile, and drains sooner)
            ended_s = time.monotonic() - t0
            lost = [
                j for j in ids if plat.http.get(f"/v1/jobs/{j}").json()["status"] not in TERMINAL
            ]
            if lost:
                raise SystemExit(f"{label}: {len(lost)} admitted jobs never finished")
            out[label].append(len(ids) / args.seconds)
            print(
                f"  round {i + 1} {label}: {out[label][-1]:.1f} admissions/s, "
                f"{len(ids) / ended_s:.1f} jobs/s to the last one's end",
                flush=True,
            )
    return out


def report(
    results: dict[str, dict[str, list[float]]], rounds: dict[str, list[float]] | None
) -> None:
    def pct(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100, method="inclusive")[q - 1]

    print("| ms | base p50 | base p99 | this p50 | this p99 | this / base (p50) |")
    print("|---|---:|---:|---:|---:|---:|")
    ratios = {}
    for stage in STAGES:
        b, t = results["base"][stage], results["this"][stage]
        ratios[stage] = round(pct(t, 50) / pct(b, 50), 3)
        print(f"| {stage} | {pct(b, 50):.2f} | {pct(b, 99):.2f} | {pct(t, 50):.2f} | "
              f"{pct(t, 99):.2f} | {ratios[stage]:.2f} |")  # fmt: skip
    line: dict[str, Any] = {"bench": "ab_warm_path", "p50_this_over_base": ratios}
    if rounds:
        b, t = rounds["base"], rounds["this"]
        print(f"\nasync admissions/s per round: base {b}, this {t}")
        print(f"medians: base {statistics.median(b):.1f}, this {statistics.median(t):.1f}")
        line["admissions_median_this_over_base"] = round(
            statistics.median(t) / statistics.median(b), 3
        )
    print(json.dumps(line))


if __name__ == "__main__":
    main()

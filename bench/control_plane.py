"""Control-plane overhead on the embedded platform: admissions per second, what the platform
adds to a warm 1-token request, and the time to the first SSE event.

    .venv/bin/python bench/control_plane.py              # ~2 min
    .venv/bin/python bench/control_plane.py --seconds 5 --runs 300

Starts `platform up --detach` in a temporary state directory (stopped with `platform down`, no
process left behind), deploys the demo model with one warm worker (min 1, max 1, target
concurrency 8) and measures, in this order:
- admissions/s: async submissions (`POST /v1/deployments/{name}/jobs`, 202) and sync runs
  (`POST .../run`, answered 200 with the finished job) by 1, 16 and 64 concurrent clients
  (threads with keep-alive connections) for `--seconds` each; every admitted job must reach a
  terminal state afterwards (the bench fails otherwise: nothing accepted may be lost);
- warm-path overhead: `--runs` sequential 1-token sync runs, client latency minus the job's
  own execution (`completed_at - started_at`), and where the platform's part goes from the job's
  own timestamps: accepted (`created_at`) -> claimed (`started_at`) -> completed. These are
  sent with httpx, the SDK's client; as many more, interleaved with them, are sent with the
  standard library's `http.client` (the worker's `JsonHttp`), whose own Python costs ~0.3 ms
  less per request each way: the difference is the client's, not the platform's; and as many
  with the SDK's `Client.run`, which sends a new Idempotency-Key with every call (the
  platform looks it up before it admits the call, and stores it): what an SDK user sees.
  Each client opens a new connection every 25 runs (`RUNS_PER_CONNECTION`): with two API
  processes, which one a connection lands on moves its answer by up to a millisecond;
- SSE: `--runs` sequential streamed runs (`stream=true`), request sent -> first event
  (`queued`/`running`) and -> first `output` event; each stream is read to its end, as the
  SDK does. Then `--runs` more that the client leaves at their first output: each leaves the
  platform a cancel (its client is gone) to run while the next one is admitted (the first
  versions of this bench measured only these).
- deploys: `--deploys` new deployments of the demo model (`POST /v1/deployments`, min 0
  workers: the model's check, no boot), one after another;
- a batch: `--batch-lines` 1-token lines (500), at most 8 in flight (the worker's slots), from
  `POST /v1/batches` until every line has ended (`batch_lines_per_s`), and from then until
  the batch is `completed` (`batch_completed_after_ms`: its results file written);
- the reconciler's tick at `--tick-deployments` deployments (1,000) and `--tick-jobs` pending
  jobs (10,000), rows created directly, after the platform is stopped (`bench/reconciler_tick.py`,
  the median tick after the first).

The admissions are measured first on a platform with one API process, then on the embedded
default (`platform up` as it comes: two API processes on a machine with two cores or more,
one port shared with SO_REUSEPORT), where the rest is measured too. With `--postgres`, a
PostgreSQL server (Debian's binaries, as the tests use) is the database of both (a fresh one
each; the second with `PLATFORM_API_PROCESSES=2`), and the tick runs on PostgreSQL as well.
`--client-processes N` spreads the admission clients over N forked processes: one Python
process's threads make about one core's worth of requests, which on a machine with many cores
is less than two API processes can admit.

The last line is `{"bench": "control_plane", "admissions_per_s": …, "overhead_p50_ms": …,
"overhead_p99_ms": …, "first_event_p50_ms": …, "tick_ms_1000_deployments": …,
"admissions_scale_2_api": …}`, where admissions_per_s is async submission at 16 clients on
the second platform and admissions_scale_2_api is that number over the first platform's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_share import Sampler, Share

CLIENTS = (1, 16, 64)
# The tenant's quotas (600 requests/min by default) would measure the rate limiter instead.
PLATFORM_ENV = {
    "PLATFORM_WARM_POOL_MAX": "0",
    "PLATFORM_DEFAULT_REQUESTS_PER_MIN": str(10**9),
    "PLATFORM_DEFAULT_TOKENS_PER_MIN": str(10**9),
    "PLATFORM_DEFAULT_MAX_IN_FLIGHT": str(10**6),
}
TERMINAL = {"succeeded", "failed", "canceled", "expired", "timed_out"}


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0 < q < 1) of the values, interpolated (one value: itself)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def hammer(
    make_client: Callable[[], Any],
    call: Callable[[Any, int], Any],
    n: int,
    seconds: float,
    processes: int = 1,
) -> tuple[list[str], dict[int, int], Share]:
    """`n` client threads calling `call(client, i)` back to back for `seconds`, spread over
    `processes` forked processes; the job ids of the admitted calls (200 or 202), the other
    answers by status, and where the machine's CPU went meanwhile. One process's GIL caps the
    load its threads make (about one core): on a machine with many cores the bench client,
    not the platform, would be what is measured."""
    processes = max(1, min(processes, n))
    barrier: Any
    if processes == 1:
        barrier = threading.Barrier(n + 1)
        out: list[tuple[list[str], dict[int, int], float]] = []
        t = threading.Thread(
            target=lambda: out.append(clients_loop(make_client, call, range(n), seconds, barrier))
        )
        t.start()
        with start_last(barrier, n) as sampler:
            t.join()
        admitted, others, _ = out[0]  # this process's CPU is in the sampler's reading
        return admitted, others, sampler.share
    # fork: the callables are closures over this process's clients and names, not picklable
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    pipes, procs = [], []
    for p in range(processes):
        recv, send = ctx.Pipe(duplex=False)
        ks = range(p, n, processes)
        procs.append(
            ctx.Process(target=client_process, args=(make_client, call, ks, seconds, barrier, send))
        )
        procs[-1].start()
        send.close()
        pipes.append(recv)
    ids: list[str] = []
    refused: dict[int, int] = {}
    forked_cpu = 0.0
    with start_last(barrier, n) as sampler:
        for recv in pipes:
            got, no, cpu = recv.recv()  # EOFError if a client process failed
            ids += got
            forked_cpu += cpu
            for status, count in no.items():
                refused[status] = refused.get(status, 0) + count
        for proc in procs:
            proc.join()
    # the load processes are gone from /proc by the sampler's last reading: their threads
    # report their own CPU from the barrier on
    return ids, refused, sampler.share.plus("bench client", forked_cpu)


@contextlib.contextmanager
def start_last(barrier: Any, n: int) -> Iterator[Sampler]:
    """Once the `n` clients wait at `barrier`, sample the machine's CPU and let them go: the
    window holds all of their calls and none of their setting up."""
    while barrier.n_waiting < n:
        time.sleep(0.002)
    with Sampler() as sampler:
        barrier.wait()
        yield sampler


def client_process(
    make_client: Callable[[], Any],
    call: Callable[[Any, int], Any],
    ks: range,
    seconds: float,
    barrier: Any,
    conn: Any,
) -> None:
    """One forked load process: its clients' results and CPU seconds sent back over `conn`."""
    conn.send(clients_loop(make_client, call, ks, seconds, barrier))
    conn.close()


def clients_loop(
    make_client: Callable[[], Any],
    call: Callable[[Any, int], Any],
    ks: range,
    seconds: float,
    barrier: Any,
) -> tuple[list[str], dict[int, int], float]:
    """A thread per client k in `ks`: each connects, waits at `barrier` for every client
    (of every process) and the sampler, then calls for `seconds`. Returns the admitted ids,
    the other answers by status, and the CPU seconds the threads used past the barrier."""
    ids: list[str] = []
    refused: dict[int, int] = {}
    cpu = [0.0]
    lock = threading.Lock()

    def loop(k: int) -> None:
        client = make_client()
        barrier.wait()
        start = time.thread_time()
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            r = call(client, k * 1_000_000 + i)
            i += 1
            with lock:
                if r.status_code in (200, 202):
                    ids.append(str(r.json()["id"]))
                else:
                    refused[r.status_code] = refused.get(r.status_code, 0) + 1
        used = time.thread_time() - start
        with lock:
            cpu[0] += used
        client.close()

    threads = [threading.Thread(target=loop, args=(k,)) for k in ks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ids, refused, cpu[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0, help="per admission measurement")
    p.add_argument("--runs", type=int, default=200, help="sequential warm runs (and streams)")
    p.add_argument("--deploys", type=int, default=20, help="deployments created, timed")
    p.add_argument("--batch-lines", type=int, default=500, help="lines of the batch, timed")
    p.add_argument("--tick-deployments", type=int, default=1000)
    p.add_argument("--tick-jobs", type=int, default=10_000)
    p.add_argument("--postgres", action="store_true", help="PostgreSQL; 1, then 2 API processes")
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes the admission clients are spread over (a machine with many cores)",
    )
    args = p.parse_args()

    from bench import reconciler_tick
    from bench.coldstart.models import build_models

    with tempfile.TemporaryDirectory(prefix="bench-cp-") as tmp:
        work = Path(tmp)
        (demo,) = build_models(work / "models", skip_big=True)
        if not args.postgres:
            print("SQLite, 1 API process:", flush=True)
            env = {**PLATFORM_ENV, "PLATFORM_API_PROCESSES": "1"}
            one = on_platform(work / "state-1", env, demo, args, full=False)
            print("SQLite, the embedded default (`platform up`: 2 API processes):", flush=True)
            report = on_platform(work / "state", PLATFORM_ENV, demo, args, full=True)
            report["admissions_1_api"] = one["admissions"]
            report["cpu_1_api"] = one["cpu"]
            report["admitted"] += one["admitted"]
            print(f"reconciler tick, {args.tick_deployments} deployments, {args.tick_jobs} jobs:")
            report["tick"] = reconciler_tick.measure(args.tick_deployments, args.tick_jobs, 6)
        else:
            with postgres() as database:
                print("PostgreSQL, 1 API process:", flush=True)
                env = {**PLATFORM_ENV, "PLATFORM_API_PROCESSES": "1"}
                with database() as url:
                    one = on_platform(work / "state-1", {**env, "PLATFORM_DATABASE_URL": url},
                                      demo, args, full=False)  # fmt: skip
                print("PostgreSQL, 2 API processes:", flush=True)
                env["PLATFORM_API_PROCESSES"] = "2"
                with database() as url:
                    report = on_platform(work / "state-2", {**env, "PLATFORM_DATABASE_URL": url},
                                         demo, args, full=True)  # fmt: skip
                report["admissions_1_api"] = one["admissions"]
                report["cpu_1_api"] = one["cpu"]
                report["admitted"] += one["admitted"]
                print(f"reconciler tick on PostgreSQL, {args.tick_deployments} deployments, "
                      f"{args.tick_jobs} jobs:")  # fmt: skip
                with database() as url:
                    report["tick"] = reconciler_tick.measure(
                        args.tick_deployments, args.tick_jobs, 6, database_url=url
                    )
    report["database"] = "postgresql" if args.postgres else "sqlite"
    report["client_processes"] = args.client_processes
    print_report(report)


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


# Warm runs per client connection. With two API processes (the embedded default) the kernel
# places each connection on one of them by a hash of its addresses, and a caller whose
# connection shares a process with the worker's is answered in process, the others through
# Redis: 0.6-0.9 ms apart at the p50 (docs/benchmarks.md, Control plane). One connection for
# the whole run measured one placement or the other by chance; a new one every 25 runs
# measures the mix that many callers see.
RUNS_PER_CONNECTION = 25


def warm_path(
    plat: Any, name: str, body: dict[str, Any], runs: int
) -> tuple[list[float], dict[str, list[float]], list[float], list[float]]:
    """Sequential 1-token sync runs: overhead (latency - execution) and the platform's stages,
    as httpx (the SDK's client) sees them; and, interleaved, the overhead as a client of the
    standard library sees it (the worker's `JsonHttp`: ~0.3 ms less of its own per request
    each way), and as a caller of the SDK sees it (`Client.run`: httpx, with a new
    Idempotency-Key on every call, which the platform looks up and stores). Each client takes
    a new connection every RUNS_PER_CONNECTION runs (its first run there is not counted: it
    opens the connection)."""
    import httpx

    from bench.coldstart.phases import parse_iso
    from sdk import Client
    from worker.runtime.json_http import JsonHttp

    url, key = plat.state["url"], plat.state["api_key"]
    auth = {"Authorization": f"Bearer {key}"}
    path = f"/v1/deployments/{name}/run"

    def connected() -> tuple[list[Any], list[Callable[[], dict[str, Any]]]]:
        plain = httpx.Client(base_url=url, headers=auth, timeout=120.0)
        lean = JsonHttp(url, auth, 120.0)
        sdk = Client(base_url=url, api_key=key, timeout=120.0)
        calls: list[Callable[[], dict[str, Any]]] = [
            lambda: plain.post(path, json=body).json(),
            lambda: lean.post(path, body).json(),
            lambda: sdk.run(name, body["input"], wait=False).raw,
        ]
        for call in calls:
            call()  # opens its connection
        return [plain, lean, sdk], calls

    overheads: tuple[list[float], ...] = ([], [], [])
    stages: dict[str, list[float]] = {"accept": [], "claim": [], "answer": []}
    opened: list[Any] = []
    calls: list[Callable[[], dict[str, Any]]] = []
    for i in range(3 * runs):
        if i % (3 * RUNS_PER_CONNECTION) == 0:
            for client in opened:
                client.close()
            opened, calls = connected()
        t0 = time.time()
        job = calls[i % 3]()
        t1 = time.time()
        if job.get("status") != "succeeded":
            raise SystemExit(f"a warm run did not succeed: {job.get('status')}")
        created, started, done = (
            parse_iso(job[k]) for k in ("created_at", "started_at", "completed_at")
        )
        overheads[i % 3].append((t1 - t0 - (done - started)) * 1000)
        if i % 3 == 0:
            stages["accept"].append((created - t0) * 1000)  # sent -> stored
            stages["claim"].append((started - created) * 1000)  # stored -> a worker claimed it
            stages["answer"].append((t1 - done) * 1000)  # completed -> the client has it
    for client in opened:
        client.close()
    return overheads[0], stages, overheads[1], overheads[2]


def sse(
    base: str, key: str, name: str, body: dict[str, Any], runs: int, httpx: Any, *, leave: bool
) -> tuple[list[float], list[float]]:
    """Sequential streamed runs: request sent -> first SSE event, and -> first `output` event.

    Each stream is read to its end (`completed`), as the SDK does; with `leave`, the client
    leaves it at its first output instead: the platform then cancels the job (its client is
    gone) while the next request is admitted."""
    first_event: list[float] = []
    first_output: list[float] = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as c:
        for _ in range(runs):
            t0 = time.perf_counter()
            seen_any = seen_output = None
            with c.stream(
                "POST", f"/v1/deployments/{name}/run", json={**body, "stream": True}
            ) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("event:"):
                        continue
                    now = time.perf_counter()
                    if seen_any is None:
                        seen_any = now
                        first_event.append((now - t0) * 1000)
                    if seen_output is None and line.split(":", 1)[1].strip() == "output":
                        seen_output = now
                        first_output.append((now - t0) * 1000)
                        if leave:
                            break
    return first_event, first_output


def print_cpu(r: dict[str, Any]) -> None:
    """Where the cores went while 16 clients submitted async jobs: cores busy on average."""
    runs = [("1 API process", r["cpu_1_api"])] if r.get("cpu_1_api") else []
    runs.append(("2 API processes" if runs else "this platform", r["cpu"]))
    kinds = sorted({k for _, cpu in runs for k in cpu["async"][16].by_kind})
    kinds = [k for k in kinds if any(cpu["async"][16].by_kind.get(k, 0) >= 0.01 for _, cpu in runs)]
    print(f"| async, 16 clients: cores (of {runs[0][1]['async'][16].cores}) | busy | "
          + " | ".join(kinds) + " |")  # fmt: skip
    print("|---|---:|" + "---:|" * len(kinds))
    for label, cpu in runs:
        share = cpu["async"][16]
        row = " | ".join(f"{share.by_kind.get(k, 0.0):.2f}" for k in kinds)
        print(f"| {label} | {share.busy_cores:.2f} | {row} |")


def print_report(r: dict[str, Any]) -> None:
    print()
    print("| measure | 1 client | 16 clients | 64 clients |")
    print("|---|---:|---:|---:|")
    one = r.get("admissions_1_api")
    for kind in ("async", "sync"):
        if one is not None:
            row = " | ".join(f"{one[kind][n]:.1f}" for n in CLIENTS)
            print(f"| {kind} admissions/s, 1 API process | {row} |")
        row = " | ".join(f"{r['admissions'][kind][n]:.1f}" for n in CLIENTS)
        label = f"{kind} admissions/s" + (", 2 API processes" if one is not None else "")
        print(f"| {label} | {row} |")
    if one is not None:
        row = " | ".join(f"{r['admissions']['async'][n] / one['async'][n]:.2f}" for n in CLIENTS)
        print(f"| async, 2 API processes / 1 | {row} |")
    print()
    print_cpu(r)
    print()
    print("| warm path, ms | p50 | p99 |")
    print("|---|---:|---:|")
    rows = [("platform overhead (latency - execution)", r["overhead_ms"])]
    rows += [(f"  {k}", v) for k, v in r["stages_ms"].items()]
    rows += [("platform overhead, a standard-library client", r["overhead_stdlib_ms"])]
    rows += [("platform overhead, the SDK's `Client.run`", r["overhead_sdk_ms"])]
    rows += [("SSE first event", r["first_event_ms"]), ("SSE first output", r["first_output_ms"])]
    rows += [
        ("SSE first event, streams left at their first output", r["left_first_event_ms"]),
        ("SSE first output, streams left at their first output", r["left_first_output_ms"]),
    ]
    rows += [("deploy (`POST /v1/deployments`, min 0 workers)", r["deploy_ms"])]
    for label, values in rows:
        print(f"| {label} | {pct(values, 0.5):.1f} | {pct(values, 0.99):.1f} |")
    print(
        f"\na batch of 1-token lines, 8 in flight: {r['batch_lines_per_s']:.1f} lines/s; "
        f"completed {r['batch_completed_after_ms']:.0f} ms after its last line"
    )
    tick = r["tick"]
    print(
        f"\nreconciler tick ({tick['deployments']} deployments, {tick['jobs']} pending jobs):"
        f" first {tick['first_tick_ms']:.0f} ms, then median {tick['tick_ms']:.0f} ms"
        f" (max {tick['tick_ms_max']:.0f} ms)"
    )
    print(f"\n{r['admitted']} admitted jobs, every one terminal")
    line = {
        "bench": "control_plane",
        "admissions_per_s": round(r["admissions"]["async"][16], 1),
        "overhead_p50_ms": round(pct(r["overhead_ms"], 0.5), 2),
        "overhead_p99_ms": round(pct(r["overhead_ms"], 0.99), 2),
        "first_event_p50_ms": round(pct(r["first_event_ms"], 0.5), 2),
        "tick_ms_1000_deployments": tick["tick_ms"],
        "admissions_scale_2_api": (
            round(r["admissions"]["async"][16] / one["async"][16], 2) if one is not None else None
        ),
        "database": r["database"],
        "sync_per_s_16": round(r["admissions"]["sync"][16], 1),
        "overhead_mean_ms": round(statistics.fmean(r["overhead_ms"]), 2),
        "first_event_left_p50_ms": round(pct(r["left_first_event_ms"], 0.5), 2),
        "cores_busy_async_16": round(r["cpu"]["async"][16].busy_cores, 2),
        "overhead_stdlib_p50_ms": round(pct(r["overhead_stdlib_ms"], 0.5), 2),
        "overhead_stdlib_p99_ms": round(pct(r["overhead_stdlib_ms"], 0.99), 2),
        "overhead_sdk_p50_ms": round(pct(r["overhead_sdk_ms"], 0.5), 2),
        "overhead_sdk_p99_ms": round(pct(r["overhead_sdk_ms"], 0.99), 2),
        "deploy_p50_ms": round(pct(r["deploy_ms"], 0.5), 1),
        "batch_lines_per_s": round(r["batch_lines_per_s"], 1),
        "batch_completed_after_ms": round(r["batch_completed_after_ms"]),
        "cores": r["cpu"]["async"][16].cores,
        "client_processes": r["client_processes"],
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()

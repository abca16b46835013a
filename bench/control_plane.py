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
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.controlplane.measure import PLATFORM_ENV, on_platform, postgres
from bench.controlplane.report import print_report


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


if __name__ == "__main__":
    main()

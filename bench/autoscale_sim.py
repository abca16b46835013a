"""Autoscaler simulator: the platform's ``decide()`` against serverless baselines on traces.

    python -m bench.autoscale_sim                      # full run (~5 minutes on 2 cores)
    python -m bench.autoscale_sim --quick --no-plot    # a small subset, seconds
    python -m bench.autoscale_sim --trace other.csv    # any Azure-CSV / Mooncake-JSONL trace

A deterministic discrete-event simulation (``bench/autoscale/``): every policy replays the same
requests (fixed service times) on workers with ``--slots`` request slots that become ready
``T_cold`` seconds after they are started, for each T_cold of ``--t-cold``. Policies:
``ours`` (``control_plane.domain.scaling.decide``, driven as the live reconciler drives it),
``keepalive`` (10 min), Knative ``kpa``, ``keda`` (queue length), the ATC'20 ``histogram``
policy and an ``oracle`` that knows the future. Workloads: the two traces of
``../shared/workloads/`` (one deployment each) and a seeded synthetic fleet of 240 deployments.

Printed: a table per workload, a Pareto plot (GPU-seconds against p99 delay, each policy's
main knob swept at T_cold = 30 s) and, as the last line, one JSON object
(``{"bench": "autoscale", ...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from bench.autoscale import bound, report
from bench.autoscale.experiment import (
    POLICIES,
    Outcome,
    Settings,
    default_jobs,
    plan,
    run_all,
    time_decide,
)
from bench.autoscale.sim import TICK_S
from bench.autoscale.workloads import ServiceModel, Workload, synthetic_workload, trace_workload
from bench.traces import WORKLOADS
from control_plane.domain.scaling import ScalingPolicy

TRACES = ("azure_llm_2023_conv.csv", "mooncake_conversation.jsonl")
DEFAULT_WORKLOADS = ("azure_llm_2023_conv", "mooncake_conversation", "synthetic")
PARETO_T_COLD_S = 30.0
DEFAULT_PLOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "autoscale_pareto.png"
# --quick: this many deployments, and the first this many requests of each trace
QUICK_DEPLOYMENTS = 24
QUICK_TRACE_REQUESTS = 1500


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quick = args.quick
    t_colds = (
        [float(x) for x in args.t_cold.split(",")]
        if args.t_cold
        else ([PARETO_T_COLD_S] if quick else [5.0, 30.0, 84.0])
    )
    pareto = args.pareto if args.pareto is not None else not quick
    plot = None if args.no_plot or (quick and args.plot is None) else (args.plot or DEFAULT_PLOT)
    service = ServiceModel(
        prompt_div=args.prompt_div,
        prompt_min=args.prompt_min,
        prompt_max=args.prompt_max,
        output_div=args.output_div,
        output_min=args.output_min,
        output_max=args.output_max,
        prefill_tok_s=args.prefill_tok_s,
        decode_s_per_token=args.decode_s_per_token,
    )
    settings = Settings(
        seed=args.seed,
        slots=args.slots,
        service=service,
        refit_s=args.refit_s,
        refresh_quiet=args.refresh_quiet,
        queue_wait_s=args.queue_wait_s,
        jobs=args.jobs,
    )
    workloads = _workloads(args, service, quick)
    names = list(workloads)
    record_for = "synthetic" if "synthetic" in workloads else names[0]
    specs = plan(names, t_colds, PARETO_T_COLD_S if pareto else None, record_for)

    started = time.perf_counter()
    print(
        f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}; {len(specs)} runs in {settings.jobs} processes"
    )
    print(f"# seed {args.seed}; how lengths were scaled: {service.describe()}")
    print(
        f"# workers: {args.slots} slots, ready T_cold s after start (T_cold in "
        f"{', '.join(f'{t:g}' for t in t_colds)}); ticks every {TICK_S:g} s; ours refits every "
        f"{args.refit_s:g} s after arrivals"
        + ("" if args.refresh_quiet else " (quiet deployments' models left to expire)")
    )
    print(
        "# policies: "
        + "; ".join(f"{p.name} {p.label(p.default)}" for p in POLICIES.values())
        + "; cold = served by a worker that became ready after the request arrived"
    )
    for w in workloads.values():
        print(f"# workload {w.name}: {w.description}")

    def progress(o: Outcome) -> None:
        r = o.result
        print(
            f"# done {r.workload} {r.policy} {r.knob} T_cold={r.t_cold_s:g}: {r.wall_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    outcomes = run_all(specs, workloads, settings, progress)
    main_results = [
        o.result
        for o in outcomes
        if o.spec.knob == POLICIES[o.spec.policy].default and o.spec.t_cold_s in t_colds
    ]
    for name in names:
        print(f"\n## {name}: {workloads[name].description}\n")
        for line in report.table([r for r in main_results if r.workload == name]):
            print(line)
    print()
    json_t_cold = _json_t_cold(t_colds)
    for line in bound.report_lines(workloads, main_results, t_colds, json_t_cold, args.slots):
        print(line)

    if pareto and plot is not None:
        sweeps = {
            name: [
                o.result
                for o in outcomes
                if o.result.workload == name
                and o.spec.t_cold_s == PARETO_T_COLD_S
                and o.spec.knob in POLICIES[o.spec.policy].sweep
            ]
            for name in names
        }
        floors = bound.cold_floor_shares(workloads, PARETO_T_COLD_S)
        report.plot_pareto(sweeps, PARETO_T_COLD_S, plot, f"seed {args.seed}", floors)
        print(f"\n# Pareto plot: {plot}")

    states = [s for o in outcomes if o.spec.record_states for s in o.states]
    decide_ms = time_decide(states)
    print(
        f"# decide(): p99 {decide_ms:.2f} ms per tick for 1,000 deployments "
        f"({len(states)} ticks of the {record_for} ours run, each tick's states repeated to "
        "1,000; each tick the fastest of 5 passes over them all)"
    )
    print(f"# total wall time {time.perf_counter() - started:.0f} s")
    floors = bound.cold_floor_shares(workloads, json_t_cold)
    print(json.dumps(report.summary(main_results, json_t_cold, decide_ms, floors)))
    return 0


def _json_t_cold(t_colds: list[float]) -> float:
    return PARETO_T_COLD_S if PARETO_T_COLD_S in t_colds else t_colds[0]


def _workloads(args: argparse.Namespace, service: ServiceModel, quick: bool) -> dict[str, Workload]:
    limit = QUICK_TRACE_REQUESTS if quick else None
    paths = {Path(t).stem: Path(t) for t in TRACES}
    paths = {name: WORKLOADS / p for name, p in paths.items()}
    chosen: list[str]
    if args.workloads:
        chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    else:
        chosen = [] if args.trace else list(DEFAULT_WORKLOADS)
    out: dict[str, Workload] = {}
    for name in chosen:
        if name == "synthetic":
            n = QUICK_DEPLOYMENTS if quick else args.deployments
            out[name] = synthetic_workload(args.seed, service, n)
        elif name in paths:
            if not paths[name].exists():
                print(f"# skipped {name}: {paths[name]} not found", file=sys.stderr)
                continue
            out[name] = trace_workload(paths[name], service, args.seed, limit)
        else:
            raise SystemExit(f"unknown workload {name!r} (known: {', '.join(DEFAULT_WORKLOADS)})")
    for t in args.trace or []:
        w = trace_workload(Path(t), service, args.seed, limit)
        out[w.name] = w
    if not out:
        raise SystemExit("no workload to run")
    return out


def _parser() -> argparse.ArgumentParser:
    d = ServiceModel()
    p = argparse.ArgumentParser(
        prog="python -m bench.autoscale_sim",
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="synthetic fleet and sync/async draws")
    p.add_argument(
        "--trace",
        action="append",
        metavar="PATH",
        help="a trace (Azure CSV or Mooncake JSONL) to run as one deployment; repeatable; "
        "alone, only the traces given run",
    )
    p.add_argument(
        "--workloads",
        help=f"comma-separated, from {', '.join(DEFAULT_WORKLOADS)} (default: all of them)",
    )
    p.add_argument("--t-cold", help="comma-separated cold-start seconds (default 5,30,84)")
    p.add_argument("--quick", action="store_true", help="small subset for tests (seconds)")
    p.add_argument("--plot", type=Path, help=f"Pareto PNG (default {DEFAULT_PLOT})")
    p.add_argument("--no-plot", action="store_true", help="skip the plot")
    p.add_argument(
        "--pareto",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"sweep each policy's knob at T_cold={PARETO_T_COLD_S:g} s (default: on, off with "
        "--quick)",
    )
    p.add_argument("--deployments", type=int, default=240, help="synthetic fleet size")
    p.add_argument("--slots", type=int, default=8, help="request slots per worker")
    p.add_argument("--prompt-div", type=float, default=d.prompt_div, help="prompt = ctx / this")
    p.add_argument("--prompt-min", type=int, default=d.prompt_min)
    p.add_argument("--prompt-max", type=int, default=d.prompt_max)
    p.add_argument("--output-div", type=float, default=d.output_div, help="output = gen / this")
    p.add_argument("--output-min", type=int, default=d.output_min)
    p.add_argument("--output-max", type=int, default=d.output_max)
    p.add_argument(
        "--prefill-tok-s",
        type=float,
        default=d.prefill_tok_s,
        help="prompt tokens per second per request (estimated from the engine benchmark)",
    )
    p.add_argument(
        "--decode-s-per-token",
        type=float,
        default=d.decode_s_per_token,
        help="seconds per output token per request (the engine benchmark's ITL p50)",
    )
    p.add_argument("--refit-s", type=float, default=10.0, help="ours: refit period (simulated)")
    p.add_argument(
        "--queue-wait-s",
        type=float,
        default=ScalingPolicy().queue_wait_s,
        help="ours: how long a job may wait for a ready worker's slot instead of a new worker "
        "(the deployment setting queue_wait_s; 0: a worker for every job that waits)",
    )
    p.add_argument(
        "--refresh-quiet",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ours: refit a quiet deployment before decide() would ignore its models as stale",
    )
    p.add_argument("--jobs", type=int, default=default_jobs(), help="simulation processes")
    return p


if __name__ == "__main__":
    sys.exit(main())

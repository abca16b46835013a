"""The autoscaler judged over a family of traces: worst case and median, never one trace.

    nice -n 10 .venv/bin/python -m bench.autoscale_family            # full: every core
    .venv/bin/python -m bench.autoscale_family --quick               # a smoke run, seconds
    .venv/bin/python -m bench.autoscale_family --seed 7              # a fresh draw of the family
    .venv/bin/python -m bench.autoscale_family --json                # one JSON line only
    .venv/bin/python -m bench.autoscale_family --plot-member gap2to4-0 --t-cold 30
    # a change to the policy, judged on the whole family against the run saved before it:
    .venv/bin/python -m bench.autoscale_family --save before.json          # (on the old code)
    .venv/bin/python -m bench.autoscale_family --reuse before.json --only ours --compare before.json
    # beyond the family: workers of one slot, calls ten times longer
    .venv/bin/python -m bench.autoscale_family --slots 1
    .venv/bin/python -m bench.autoscale_family --service-x 10

Every member of `bench/autoscale/family.py` (generated single deployments, the shared traces,
two fleets of 240 deployments) runs under `ours` (the platform's `decide()`, driven as the
live loop drives it), every baseline configuration (`bench/autoscale/judge.py::CONFIGS`:
keep-alive 1/5/10/30 min, Knative KPA with 60/180/600 s stable windows, the hybrid histogram
policy of "Serverless in the Wild", KEDA's queue-length scaler) and the oracle, at each T_cold.
Printed per T_cold: every policy's median and worst case over the members and over the fleets,
ours per generator and per member (with the floors and the targets it missed), and the
targets' tally (with `--compare`, beside an earlier run's ours: the family's numbers and every
member that moved); then the decide() timing at 1,000 deployments. The process lowers its own
priority (`--nice`) and uses every core (`--jobs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.autoscale import family, family_report, judge
from bench.autoscale.bound import cold_floor
from bench.autoscale.experiment import POLICIES, RunSpec, Settings, run_one, time_decide
from bench.autoscale.metrics import RunResult
from bench.autoscale.report import plot_pareto
from bench.autoscale.workloads import ServiceModel, Workload, synthetic_workload
from bench.traces import WORKLOADS
from control_plane.domain.scaling import DeploymentState

DEFAULT_PLOT_DIR = Path(__file__).resolve().parents[1] / "docs" / "img" / "autoscale_family"
PLOT_T_COLD_S = 30.0
# --quick: one member of four generators, 20 minutes each, and a fleet of 16 deployments
QUICK_MEMBERS = ("on_off-200x-lognormal-3min", "gap2to4-0", "periodic-5minx30-j0.02",
                 "poisson-0.2rps")  # fmt: skip
QUICK_SPAN_S = 1200.0
QUICK_FLEET = 16
FLEETS = ("synthetic", "fleet-mix")


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """Builds the family's workloads by name, the same in every process (seeded)."""

    seed: int
    service: ServiceModel
    quick: bool

    def names(self, only: set[str] | None, fleets: bool) -> list[str]:
        specs = [s.name for s in family.member_specs()]
        names = (
            list(QUICK_MEMBERS)
            if self.quick
            else specs + [Path(t).stem for t in family.TRACES if (WORKLOADS / t).exists()]
        )
        if fleets:
            names += ["fleet-mix"] if self.quick else list(FLEETS)
        if only:
            names = [n for n in names if n in only or _generator(n) in only]
        return names

    def load(self, name: str) -> Workload:
        if name == "synthetic":
            return synthetic_workload(self.seed, self.service, family.FLEET_SIZE)
        if name == "fleet-mix":
            if self.quick:
                return family.fleet_mix(self.seed, self.service, QUICK_FLEET, QUICK_SPAN_S)
            return family.fleet_mix(self.seed, self.service, family.FLEET_SIZE, family.FLEET_SPAN_S)
        specs = {s.name: s for s in family.member_specs()}
        if name in specs:
            spec = specs[name]
            if self.quick:
                spec = dataclasses.replace(spec, span_s=QUICK_SPAN_S)
            return family.build(spec, self.seed, self.service)
        return family.members(self.seed, self.service, {name})[name]


def _generator(name: str) -> str:
    if name in FLEETS:
        return "fleet"
    for s in family.member_specs():
        if s.name == name:
            return s.generator
    return "trace"


_WORKER: dict[str, Any] = {}


def _init(source: Source, settings: Settings, ours_knob: tuple[float, ...]) -> None:
    _WORKER.update(source=source, settings=settings, cache={}, ours_knob=ours_knob)


def _run(task: tuple[str, str, float, bool]) -> tuple[str, str, float, RunResult, list[Any]]:
    name, label, t_cold_s, record = task
    cache: dict[str, Workload] = _WORKER["cache"]
    if name not in cache:
        cache.clear()  # tasks come grouped by member: keep one
        cache[name] = _WORKER["source"].load(name)
    c = judge.BY_LABEL[label]
    knob = c.knob or _WORKER["ours_knob"] if c.policy == "ours" else c.knob
    spec = RunSpec(name, c.policy, knob or POLICIES[c.policy].default, t_cold_s, record)
    out = run_one(spec, cache[name], _WORKER["settings"])
    return name, label, t_cold_s, out.result, out.states


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    quick = args.quick
    t_colds = [float(x) for x in args.t_cold.split(",")] if args.t_cold else (
        [30.0] if quick else [5.0, 30.0, 84.0])  # fmt: skip
    if not args.service_x > 0:
        raise SystemExit("--service-x must be above 0")
    base = ServiceModel()
    # every call's service time × service_x: the engine's rates divided by it
    service = dataclasses.replace(
        base,
        prefill_tok_s=base.prefill_tok_s / args.service_x,
        decode_s_per_token=base.decode_s_per_token * args.service_x,
    )
    settings = Settings(seed=args.seed, slots=args.slots, service=service)
    # what a save's runs were drawn with: runs of another setup are not mixed with this one's
    setup = {"seed": args.seed, "quick": quick, "slots": args.slots, "service_x": args.service_x}
    if args.queue_wait_s is not None:
        settings = dataclasses.replace(settings, queue_wait_s=args.queue_wait_s)
    source = Source(args.seed, service, quick)
    only = {x.strip() for x in args.members.split(",")} if args.members else None
    names = source.names(only, fleets=not args.no_fleets)
    if not names:
        raise SystemExit("no member matches --members")
    workloads = {n: source.load(n) for n in names}
    labels = [c.label for c in judge.CONFIGS]
    ours_knob = (args.cold_penalty,) if args.cold_penalty is not None else ()
    rerun = set(args.only.split(",")) if args.only else set(labels)
    reused = _load(args.reuse, setup) if args.reuse else {}
    earlier = _load(args.compare, setup) if args.compare else {}
    record_for = next((n for n in ("fleet-mix", "synthetic") if n in names), names[0])
    record_t = PLOT_T_COLD_S if PLOT_T_COLD_S in t_colds else t_colds[0]
    tasks = [
        (n, label, t, label == "ours" and n == record_for and t == record_t)
        for n in names
        for t in t_colds
        for label in labels
        if label in rerun or (n, label, t) not in reused
    ]
    tasks.sort(key=lambda k: -_cost(workloads[k[0]], k[1]))
    log = (lambda *a: None) if args.json else print
    log(
        f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}; {len(tasks)} runs in {args.jobs} processes "
        f"(nice {os.nice(0)}); seed {args.seed}{' (quick)' if quick else ''}"
    )
    log(f"# service: {service.describe()}; {args.slots} slots per worker; T_cold in "
        + ", ".join(f"{t:g}" for t in t_colds))  # fmt: skip
    log("# configurations: " + ", ".join(labels) + f"; reference {judge.REFERENCE}")
    started = time.perf_counter()
    results: dict[tuple[str, str, float], RunResult] = dict(reused)
    states: list[tuple[float, list[DeploymentState]]] = []
    with ProcessPoolExecutor(
        args.jobs, initializer=_init, initargs=(source, settings, ours_knob)
    ) as pool:
        for name, label, t, result, st in pool.map(_run, tasks, chunksize=1):
            results[(name, label, t)] = result
            states += st
            if args.progress:
                print(f"# done {name} {label} T_cold={t:g}: {result.wall_s:.1f} s", file=sys.stderr)
    if args.save:
        _save(args.save, setup, results)

    by_t: dict[float, list[judge.Verdict]] = {}
    for t in t_colds:
        verdicts = _judged(results, workloads, names, labels, t)
        by_t[t] = verdicts
        share = {n: family.wake_floor(workloads[n], t, family.LONGEST_KEEPALIVE_S)
                 / max(workloads[n].num_requests, 1) for n in names}  # fmt: skip
        singles = [v for v in verdicts if not v.fleet]
        fleets = [v for v in verdicts if v.fleet]
        log(f"\n## T_cold = {t:g} s\n")
        if singles:
            members = len({v.member for v in singles})
            for line in family_report.policy_table(singles, f"{members} single-deployment members"):
                log(line)
        if fleets:
            for line in family_report.policy_table(fleets, f"{len(FLEETS)} fleets"):
                log(line)
        for line in family_report.generator_table(verdicts):
            log(line)
        if args.by_generator:
            for g in dict.fromkeys(v.generator for v in verdicts):
                rows = [v for v in verdicts if v.generator == g]
                members = len({v.member for v in rows})
                for line in family_report.policy_table(rows, f"{g}: {members} members"):
                    log(line)
        for line in family_report.member_table(verdicts, share):
            log(line)
        if args.all_rows:
            for line in family_report.all_rows(verdicts):
                log(line)
        for line in family_report.targets_lines(verdicts, t):
            log(line)
        if earlier:
            # the earlier run's ours among this run's baselines, on the members it has
            compared = [n for n in names if (n, "ours", t) in earlier]
            mixed = {**results, **{k: r for k, r in earlier.items() if k[1] == "ours"}}
            before = _judged(mixed, workloads, compared, labels, t)
            log("")
            for line in family_report.compare_lines(before, verdicts, t):
                log(line)

    decide_ms = time_decide(states)
    log(f"\n# decide(): p99 {decide_ms:.2f} ms per tick for 1,000 deployments ({len(states)} "
        f"ticks of the {record_for} ours run, each tick's states repeated to 1,000)")  # fmt: skip
    log(f"# wall time {time.perf_counter() - started:.0f} s")
    print(json.dumps(family_report.summary_json(by_t, args.seed, decide_ms, len(names))))
    if args.plot_member:
        _plots(args, source, settings, t_colds)
    return 0


def _plots(
    args: argparse.Namespace, source: Source, settings: Settings, t_colds: list[float]
) -> None:
    t = PLOT_T_COLD_S if PLOT_T_COLD_S in t_colds else t_colds[0]
    for name in args.plot_member:
        w = source.load(name)
        specs = [RunSpec(name, p.name, k, t) for p in POLICIES.values() for k in p.sweep]
        with ProcessPoolExecutor(args.jobs) as pool:
            outs = list(pool.map(run_one, specs, [w] * len(specs), [settings] * len(specs)))
        floor = {name: _floor_share(w, t)}
        path = args.plot_dir / f"{name}.png"
        plot_pareto({name: [o.result for o in outs]}, t, path, f"seed {args.seed}", floor)
        if not args.json:
            print(f"# Pareto plot: {path}")


def _judged(
    results: dict[tuple[str, str, float], RunResult],
    workloads: dict[str, Workload],
    names: list[str],
    labels: list[str],
    t: float,
) -> list[judge.Verdict]:
    """Every configuration on each of `names` at T_cold `t`, judged (`judge.judge`)."""
    out: list[judge.Verdict] = []
    for n in names:
        runs = {label: results[(n, label, t)] for label in labels}
        out += judge.judge(runs, n, _generator(n), _floor_share(workloads[n], t), n in FLEETS)
    return out


def _floor_share(w: Workload, t_cold_s: float) -> float:
    """The share of the calls within T_cold of their deployment's first call (`cold_floor`)."""
    return cold_floor(w, t_cold_s) / max(w.num_requests, 1)


def _cost(w: Workload, label: str) -> float:
    per_tick = {"ours": 10.0, "oracle": 0.0}.get(label, 1.0)
    return len(w.deployments) * w.duration_s * per_tick + w.num_requests


def _save(
    path: Path, setup: dict[str, object], results: dict[tuple[str, str, float], RunResult]
) -> None:
    rows = [
        {"member": n, "label": label, **dataclasses.asdict(r)}
        for (n, label, t), r in results.items()
    ]
    path.write_text(json.dumps({**setup, "results": rows}))


# a save from before the setup was recorded in full was drawn with these
SETUP_DEFAULTS = {"slots": 8, "service_x": 1.0}


def _load(path: Path, setup: dict[str, object]) -> dict[tuple[str, str, float], RunResult]:
    data = json.loads(path.read_text())
    saved = {k: data.get(k, SETUP_DEFAULTS.get(k)) for k in setup}
    if saved != setup:
        got, want = (", ".join(f"{k} {v}" for k, v in d.items()) for d in (saved, setup))
        raise SystemExit(f"{path}: saved with {got}; this run has {want}")
    out = {}
    for row in data["results"]:
        key = (row.pop("member"), row.pop("label"), row["t_cold_s"])
        out[key] = RunResult(**row)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.autoscale_family",
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="draws every member afresh")
    p.add_argument("--quick", action="store_true", help="four short members and a small fleet")
    p.add_argument("--t-cold", help="comma-separated boot seconds (default 5,30,84; quick 30)")
    p.add_argument("--members", help="comma-separated member or generator names (default all)")
    p.add_argument("--no-fleets", action="store_true", help="leave the two fleets out")
    p.add_argument("--slots", type=int, default=8, help="request slots per worker")
    p.add_argument(
        "--service-x",
        type=float,
        default=1.0,
        help="every call's service time × this (longer or shorter calls than the CPU engine's)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    p.add_argument("--nice", type=int, default=10, help="lower this process's priority by this")
    p.add_argument("--json", action="store_true", help="print only the final JSON line")
    p.add_argument("--all-rows", action="store_true", help="every policy on every member")
    p.add_argument(
        "--by-generator", action="store_true", help="every policy's table per generator too"
    )
    p.add_argument("--progress", action="store_true", help="a line on stderr per run")
    p.add_argument("--plot-member", action="append", help="a member to sweep and plot")
    p.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOT_DIR)
    p.add_argument(
        "--cold-penalty",
        type=float,
        help="ours: the deployment's cold_penalty_s (default: the deployment default)",
    )
    p.add_argument(
        "--queue-wait-s", type=float, help="ours: the deployment's queue_wait_s (default: its)"
    )
    p.add_argument("--save", type=Path, help="write every run's numbers here (JSON)")
    p.add_argument(
        "--reuse", type=Path, help="take runs from a --save file (same seed); the others run afresh"
    )
    p.add_argument("--only", help="with --reuse: the labels to run again (e.g. ours)")
    p.add_argument(
        "--compare",
        type=Path,
        help="a --save file (same seed): its ours beside this run's, judged by the same baselines",
    )
    return p


if __name__ == "__main__":
    sys.exit(main())

"""How few GPU-seconds a boot budget allows: a lower bound no policy beats without queueing.

The autoscaler's targets ask for both ≤ 0.75 × keep-alive's GPU-seconds and ≤ 0.25 × KPA's
boots. This module tells whether any policy can meet both on a workload while it makes no
request wait for a free slot.

With no request waiting, a deployment needs n(t) = ceil(requests in service / slots) workers,
and worker level k is needed on the intervals where n(t) ≥ k (`oracle.need_intervals`).
Workers are interchangeable, so any schedule can be read level by level.
- A level is provisioned at least from its first need to its last: its span.
- Each gap between two of its intervals is either kept, which costs the gap, or closed,
  which costs one more boot.
- A closed gap saves the gap minus the boot's own provisioned seconds when the worker must be
  ready in time (`pay_boot`).
- If boots could overlap the need they serve (every request of the level's next interval
  waiting out the boot), a closed gap would save the whole gap. The bound is then lower
  still, and holds for any policy that keeps each level's intervals as they are.
Gaps are independent choices that each cost one boot, so the best use of a budget closes
the largest savings first. Every level needs one boot of its own to exist at all.

A policy can only go lower by changing n(t) itself: running fewer workers than in-service
requests need, which makes requests wait for slots. Over a fleet, each deployment's levels are
more levels of the same kind: the bound for a fleet-wide budget closes the largest gaps of all.

The cold-start floor (`cold_floor`) is a bound of another kind, on every scale-to-zero policy,
the oracle excepted: nothing runs for a deployment before its first call, so no worker can be
ready before the first call + T_cold, and every call that arrives in between waits for a boot.

    .venv/bin/python -m bench.autoscale.bound     # both traces, T_cold = 30 s: under a second
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.autoscale.oracle import need_intervals

if TYPE_CHECKING:
    from bench.autoscale.metrics import RunResult
    from bench.autoscale.workloads import Workload

Intervals = list[tuple[float, float]]
# The autoscaler's boot target: at most this share of the KPA baseline's boots.
BOOTS_VS_KPA = 0.25


@dataclass(frozen=True, slots=True)
class Bound:
    """The least provisioned worker-seconds of one deployment for a number of boots."""

    boots: int
    gpu_s: float


def bounds(
    levels: list[Intervals], t_cold_s: float, budgets: list[int], pay_boot: bool = True
) -> list[Bound | None]:
    """The least GPU-seconds for each boot budget (None: fewer boots than levels).

    `pay_boot`: each boot is provisioned for `t_cold_s` before its worker is needed (no
    request waits for it). Without it, a boot costs nothing, an optimistic bound."""
    n, span, savings = _plan(levels, t_cold_s, pay_boot)
    out: list[Bound | None] = []
    for budget in budgets:
        extra = budget - n
        if extra < 0:
            out.append(None)
            continue
        out.append(Bound(n + min(extra, len(savings)), span - sum(savings[:extra])))
    return out


def boots_for(levels: list[Intervals], t_cold_s: float, gpu_s: float) -> int | None:
    """The fewest boots whose bound (ready in time) is at most `gpu_s`; None: none is."""
    n, cost, savings = _plan(levels, t_cold_s, pay_boot=True)
    for extra in range(len(savings) + 1):
        if cost <= gpu_s:
            return n + extra
        if extra < len(savings):
            cost -= savings[extra]
    return None


def _plan(
    levels: list[Intervals], t_cold_s: float, pay_boot: bool
) -> tuple[int, float, list[float]]:
    """(levels, GPU-seconds with every gap kept, each closable gap's saving, largest first)."""
    levels = [iv for iv in levels if iv]
    boot_cost = t_cold_s if pay_boot else 0.0
    span = sum(iv[-1][1] - iv[0][0] for iv in levels) + boot_cost * len(levels)
    gaps = (b[0] - a[1] for iv in levels for a, b in itertools.pairwise(iv))
    return len(levels), span, sorted((g - boot_cost for g in gaps if g > boot_cost), reverse=True)


def cold_floor(workload: Workload, t_cold_s: float) -> int:
    """Calls that arrive within `t_cold_s` of their deployment's first call (that one
    included): cold under any policy that starts no worker for a deployment before it is
    called."""
    floor = 0
    for d in workload.deployments:
        times = [r.arrival_s for r in d.requests]  # in time order
        if times:
            floor += bisect.bisect_left(times, times[0] + t_cold_s)
    return floor


def cold_floor_share(workload: Workload, t_cold_s: float) -> float:
    """`cold_floor` as a share of the workload's calls."""
    return cold_floor(workload, t_cold_s) / max(workload.num_requests, 1)


def cold_floor_shares(workloads: dict[str, Workload], t_cold_s: float) -> dict[str, float]:
    return {name: cold_floor_share(w, t_cold_s) for name, w in workloads.items()}


def report_lines(
    workloads: dict[str, Workload],
    results: Sequence[RunResult],
    t_colds: Sequence[float],
    t_cold_s: float,
    slots: int,
) -> list[str]:
    """For `bench/autoscale_sim.py`, per workload: its cold-start floor at each of `t_colds`,
    and at `t_cold_s` the least GPU-seconds (against keep-alive's in `results`) that KPA's
    boots × BOOTS_VS_KPA allow with no request waiting (a fleet's deployments share the
    budget)."""
    out = []
    for name, w in workloads.items():
        floors = ", ".join(f"{100 * cold_floor_share(w, t):.2f} % at T_cold={t:g}" for t in t_colds)
        out.append(
            f"# {name}: cold-start floor of a scale-to-zero policy (the calls within T_cold "
            f"of their deployment's first): {floors}"
        )
        runs = {r.policy: r for r in results if r.workload == name and r.t_cold_s == t_cold_s}
        if not {"kpa", "keepalive"} <= set(runs):
            continue
        budget = math.floor(BOOTS_VS_KPA * runs["kpa"].boots)
        levels = [iv for d in w.deployments for iv in need_intervals(d, slots)]
        (least,) = bounds(levels, t_cold_s, [budget])
        said = (
            f"are fewer than the {len(levels)} worker levels its requests need"
            if least is None
            else f"allow at least {least.gpu_s / runs['keepalive'].gpu_s:.3f}× keep-alive's "
            "GPU-seconds"
        )
        out.append(
            f"# {name}, T_cold={t_cold_s:g}: with no request waiting, {budget} boots "
            f"({BOOTS_VS_KPA:g}× KPA's) {said} (bench/autoscale/bound.py)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.autoscale.experiment import RunSpec, Settings, run_one
    from bench.autoscale.workloads import trace_workload
    from bench.autoscale_sim import TRACES
    from bench.traces import WORKLOADS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--t-cold", type=float, default=30.0)
    p.add_argument("--boots-vs-kpa", type=float, default=BOOTS_VS_KPA, help="the boot budget")
    p.add_argument("--trace", action="append", help="a trace file (default: the two given)")
    args = p.parse_args(argv)
    settings = Settings()
    paths = [Path(t) for t in args.trace] if args.trace else [WORKLOADS / t for t in TRACES]
    print(f"T_cold {args.t_cold:g} s, {settings.slots} slots per worker")
    print("| workload | levels | KPA boots | budget | keep-alive GPU-s | least GPU-s, ready in "
          "time | least GPU-s, boots free | boots for 0.75×, ready in time |")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for path in paths:
        w = trace_workload(path, settings.service, settings.seed, None)
        if len(w.deployments) != 1:
            print(f"# skipped {w.name}: one deployment per trace only", file=sys.stderr)
            continue
        runs = {
            name: run_one(RunSpec(w.name, name, knob, args.t_cold), w, settings).result
            for name, knob in (("keepalive", (600.0,)), ("kpa", (60.0,)))
        }
        keep_gpu, kpa_boots = runs["keepalive"].gpu_s, runs["kpa"].boots
        levels = need_intervals(w.deployments[0], settings.slots)
        budget = math.floor(args.boots_vs_kpa * kpa_boots)
        paid, free = (bounds(levels, args.t_cold, [budget], pay) for pay in (True, False))
        needed = boots_for(levels, args.t_cold, 0.75 * keep_gpu)
        print(
            f"| {w.name} | {len(levels)} | {kpa_boots} | {budget} | {keep_gpu:,.0f} | "
            f"{_ratio(paid[0], keep_gpu)} | {_ratio(free[0], keep_gpu)} | "
            f"{needed if needed is not None else 'none'} |"
        )
    return 0


def _ratio(b: Bound | None, keep_gpu: float) -> str:
    return "no schedule" if b is None else f"{b.gpu_s:,.0f} ({b.gpu_s / keep_gpu:.3f}×)"


if __name__ == "__main__":
    raise SystemExit(main())

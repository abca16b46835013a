"""Judging policies over the trace family: domination, the targets, worst case and median.

Each run is a point (GPU-seconds, sync p99 delay, cold-start rate) per member, policy
configuration and T_cold; lower is better on all three. A policy is *dominated* on a member by
a configuration that is no worse on all three and better on at least one (exactly: no
tolerance). Ratios and differences are taken against keep-alive 10 min (`REFERENCE`).

Targets, per member, for the policy judged (`targets`):
- `undominated`: no baseline configuration dominates it;
- `cold_vs_ref`: cold rate ≤ the reference's + 1 percentage point;
- `cold_abs`: cold rate ≤ max(1 %, floor + 1 pp), judged where the reference itself is within
  that (the floor: `bound.cold_floor`, the calls within T_cold of the first);
- `p99`: sync p99 ≤ the reference's + 1 s;
- `gpu`: GPU-seconds ≤ the reference's;
- `fleet_cold`: on a multi-tenant fleet, cold rate ≤ floor + 1 pp;
and over the family: `gpu_median`, the median GPU-seconds ratio ≤ 0.75.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.autoscale.metrics import RunResult

REFERENCE = "keepalive-10min"
COLD_SLACK = 0.01  # one percentage point
COLD_ABS = 0.01
P99_SLACK_S = 1.0
GPU_MEDIAN = 0.75


@dataclass(frozen=True, slots=True)
class Config:
    """One policy configuration of the family run."""

    label: str  # e.g. "keepalive-10min"
    policy: str  # `experiment.POLICIES` key
    knob: tuple[float, ...]
    baseline: bool = True  # False: the policy judged (ours) or the oracle


CONFIGS = (
    Config("ours", "ours", (), baseline=False),
    Config("keepalive-1min", "keepalive", (60.0,)),
    Config("keepalive-5min", "keepalive", (300.0,)),
    Config(REFERENCE, "keepalive", (600.0,)),
    Config("keepalive-30min", "keepalive", (1800.0,)),
    Config("kpa-60s", "kpa", (60.0,)),
    Config("kpa-180s", "kpa", (180.0,)),
    Config("kpa-600s", "kpa", (600.0,)),
    Config("histogram", "histogram", (5.0, 99.0)),
    Config("keda", "keda", (300.0,)),
    Config("oracle", "oracle", (), baseline=False),
)
BY_LABEL = {c.label: c for c in CONFIGS}


@dataclass(frozen=True, slots=True)
class Point:
    gpu_s: float
    p99_s: float
    cold: float

    @staticmethod
    def of(r: RunResult) -> Point:
        # a member without sync calls has no sync p99: every policy's is 0 there
        p99 = 0.0 if math.isnan(r.sync_p99_s) else r.sync_p99_s
        return Point(r.gpu_s, p99, r.cold_rate)

    def dominated_by(self, other: Point) -> bool:
        no_worse = other.gpu_s <= self.gpu_s and other.p99_s <= self.p99_s
        no_worse = no_worse and other.cold <= self.cold
        return no_worse and (other.gpu_s, other.p99_s, other.cold) != (
            self.gpu_s,
            self.p99_s,
            self.cold,
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """One configuration on one member at one T_cold, against the reference."""

    member: str
    generator: str
    label: str
    t_cold_s: float
    point: Point
    gpu_ratio: float  # GPU-seconds / the reference's
    p99_delta_s: float  # sync p99 − the reference's
    cold_delta: float  # cold rate − the reference's
    floor: float  # `bound.cold_floor` share
    fleet: bool
    dominated_by: tuple[str, ...]  # baseline labels that dominate it
    missed: tuple[str, ...]  # targets missed (see the module doc)
    boots: int


def judge(
    results: dict[str, RunResult],
    member: str,
    generator: str,
    floor: float,
    fleet: bool,
) -> list[Verdict]:
    """Every configuration of one member at one T_cold (`results` by label)."""
    ref = results[REFERENCE]
    ref_p = Point.of(ref)
    out = []
    points = {label: Point.of(r) for label, r in results.items()}
    for label, r in results.items():
        p = points[label]
        by = tuple(
            other
            for other, q in points.items()
            if other != label and BY_LABEL[other].baseline and p.dominated_by(q)
        )
        missed = []
        if by:
            missed.append("undominated")
        if p.cold > ref_p.cold + COLD_SLACK:
            missed.append("cold_vs_ref")
        bound = max(COLD_ABS, floor + COLD_SLACK)
        if ref_p.cold <= bound and p.cold > bound:
            missed.append("cold_abs")
        if p.p99_s > ref_p.p99_s + P99_SLACK_S:
            missed.append("p99")
        if p.gpu_s > ref_p.gpu_s:
            missed.append("gpu")
        if fleet and p.cold > floor + COLD_SLACK:
            missed.append("fleet_cold")
        out.append(
            Verdict(
                member,
                generator,
                label,
                r.t_cold_s,
                p,
                p.gpu_s / ref_p.gpu_s if ref_p.gpu_s else math.nan,
                p.p99_s - ref_p.p99_s,
                p.cold - ref_p.cold,
                floor,
                fleet,
                by,
                tuple(missed),
                r.boots,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Summary:
    """One configuration over a set of members: medians and worst cases (with the member)."""

    label: str
    members: int
    gpu_median: float
    gpu_worst: tuple[float, str]
    p99_median: float
    p99_worst: tuple[float, str]
    cold_median: float  # cold-rate difference to the reference
    cold_worst: tuple[float, str]
    dominated: int  # members where some baseline dominates it
    met: int  # members where it meets every target


def summarize(verdicts: Sequence[Verdict]) -> Summary:
    assert verdicts
    label = verdicts[0].label

    def worst(key: str) -> tuple[float, str]:
        v = max(verdicts, key=lambda v: _nan_low(getattr(v, key)))
        return getattr(v, key), v.member

    return Summary(
        label,
        len(verdicts),
        _median(v.gpu_ratio for v in verdicts),
        worst("gpu_ratio"),
        _median(v.p99_delta_s for v in verdicts),
        worst("p99_delta_s"),
        _median(v.cold_delta for v in verdicts),
        worst("cold_delta"),
        sum(1 for v in verdicts if v.dominated_by),
        sum(1 for v in verdicts if not v.missed),
    )


def family_missed(verdicts: Sequence[Verdict]) -> list[str]:
    """The family-wide targets one configuration misses (its verdicts on every member)."""
    out = []
    ratios = [v.gpu_ratio for v in verdicts if not v.fleet]
    if ratios and _median(ratios) > GPU_MEDIAN:
        out.append("gpu_median")
    return out


def _median(xs: Iterable[float]) -> float:
    values = [x for x in xs if not math.isnan(x)]
    return statistics.median(values) if values else math.nan


def _nan_low(x: float) -> float:
    return -math.inf if math.isnan(x) else x

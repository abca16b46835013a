"""Printing the family run (`bench/autoscale_family.py`): tables and the JSON line."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.autoscale.judge import CONFIGS, REFERENCE, Summary, Verdict, family_missed, summarize


def policy_table(verdicts: Sequence[Verdict], title: str) -> list[str]:
    """Rows: every configuration over the members in `verdicts`; median and worst."""
    out = [
        f"### {title}",
        "",
        "| policy | members | GPU-s × ka-10min median | worst | sync p99 − ka-10min median s | "
        "worst s | cold − ka-10min median pp | worst pp | dominated on | all targets met on |",
        "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for c in CONFIGS:
        vs = [v for v in verdicts if v.label == c.label]
        if not vs:
            continue
        s = summarize(vs)
        name = f"**{c.label}**" if c.label == "ours" else c.label
        out.append(
            f"| {name} | {s.members} | {_f(s.gpu_median, 3)} | {_worst(s.gpu_worst, 3)} | "
            f"{_f(s.p99_median, 2)} | {_worst(s.p99_worst, 2)} | {_pp(s.cold_median)} | "
            f"{_worst_pp(s.cold_worst)} | {s.dominated} | {s.met} |"
        )
    return [*out, ""]


def generator_table(verdicts: Sequence[Verdict], label: str = "ours") -> list[str]:
    """Rows: one generator each, for one configuration."""
    gens: dict[str, list[Verdict]] = {}
    for v in verdicts:
        if v.label == label:
            gens.setdefault(v.generator, []).append(v)
    out = [
        f"### {label}, per generator",
        "",
        "| generator | members | GPU-s × ka-10min median | worst | sync p99 − ka-10min median s | "
        "worst s | cold − ka-10min median pp | worst pp | dominated on | all targets met on |",
        "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for g, vs in gens.items():
        s = summarize(vs)
        out.append(
            f"| {g} | {s.members} | {_f(s.gpu_median, 3)} | {_worst(s.gpu_worst, 3)} | "
            f"{_f(s.p99_median, 2)} | {_worst(s.p99_worst, 2)} | {_pp(s.cold_median)} | "
            f"{_worst_pp(s.cold_worst)} | {s.dominated} | {s.met} |"
        )
    return [*out, ""]


def member_table(verdicts: Sequence[Verdict], beyond: dict[str, float]) -> list[str]:
    """One row per member for ours: its numbers against the reference, the floors, and what it
    missed. `beyond`: the share of each member's calls within T_cold of a wake after longer
    than the longest keep-alive compared (`family.wake_floor`)."""
    by = {(v.member, v.label): v for v in verdicts}
    out = [
        "### ours, per member",
        "",
        "| member | generator | floor % | beyond 30 min % | cold % | ka-10min cold % | "
        "sync p99 s | − ka-10min s | GPU-s × ka-10min | boots | ka-10min boots | "
        "dominated by | missed |",
        "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|:--|:--|",
    ]
    members = list(dict.fromkeys(v.member for v in verdicts))
    for m in members:
        v, ref = by.get((m, "ours")), by.get((m, REFERENCE))
        if v is None or ref is None:
            continue
        out.append(
            f"| {m} | {v.generator} | {100 * v.floor:.2f} | {100 * beyond.get(m, 0.0):.2f} | "
            f"{100 * v.point.cold:.2f} | {100 * ref.point.cold:.2f} | {v.point.p99_s:.2f} | "
            f"{v.p99_delta_s:+.2f} | {_f(v.gpu_ratio, 3)} | {v.boots} | {ref.boots} | "
            f"{', '.join(v.dominated_by) or '-'} | {', '.join(v.missed) or '-'} |"
        )
    return [*out, ""]


def all_rows(verdicts: Sequence[Verdict]) -> list[str]:
    """Every configuration on every member (long)."""
    out = [
        "| member | policy | cold % | sync p99 s | GPU-s | × ka-10min | boots | dominated by |",
        "|:--|:--|--:|--:|--:|--:|--:|:--|",
    ]
    for v in verdicts:
        out.append(
            f"| {v.member} | {v.label} | {100 * v.point.cold:.2f} | {v.point.p99_s:.2f} | "
            f"{v.point.gpu_s:,.0f} | {_f(v.gpu_ratio, 3)} | {v.boots} | "
            f"{', '.join(v.dominated_by) or '-'} |"
        )
    return [*out, ""]


def targets_lines(verdicts: Sequence[Verdict], t_cold_s: float) -> list[str]:
    """Which of ours' targets hold on how many members, and where they do not."""
    ours = [v for v in verdicts if v.label == "ours"]
    names = ("undominated", "cold_vs_ref", "cold_abs", "p99", "gpu", "fleet_cold")
    out = [f"# targets at T_cold={t_cold_s:g} s, ours on {len(ours)} members:"]
    for name in names:
        missed = [v.member for v in ours if name in v.missed]
        judged = len(ours) if name != "fleet_cold" else sum(v.fleet for v in ours)
        out.append(
            f"#   {name}: met on {judged - len(missed)} of {judged}"
            + (f"; missed on {', '.join(missed)}" if missed else "")
        )
    fam = family_missed(ours)
    members = [v for v in ours if not v.fleet]  # none where only the fleets were run
    s = summarize(members) if members else None
    if s is not None:
        out.append(f"#   gpu_median: {s.gpu_median:.3f} (≤ 0.75): {'missed' if fam else 'met'}")
    return out


def compare_lines(before: Sequence[Verdict], now: Sequence[Verdict], t_cold_s: float) -> list[str]:
    """Ours in an earlier run (`before`, judged against this run's baselines) beside ours now,
    on the members both have: the family's numbers, then each member whose targets moved, or
    whose GPU-seconds moved by more than half a percent of keep-alive's or whose p99 by more
    than 50 ms."""
    old = {v.member: v for v in before if v.label == "ours"}
    new = {v.member: v for v in now if v.label == "ours" and v.member in old}
    out = [
        f"### ours before and now, T_cold = {t_cold_s:g} s ({len(new)} members)",
        "",
        "| run | GPU-s × ka-10min median | worst p99 − ka-10min s | p99 met | undominated | "
        "all targets met on |",
        "|:--|--:|--:|--:|--:|--:|",
    ]
    for name, vs in (("before", [old[m] for m in new]), ("now", list(new.values()))):
        if not vs:
            continue
        s = summarize(vs)
        gpu_median = summarize([v for v in vs if not v.fleet] or vs).gpu_median  # as the family's
        p99_met = sum(1 for v in vs if "p99" not in v.missed)
        out.append(
            f"| {name} | {_f(gpu_median, 3)} | {_worst(s.p99_worst, 2)} | {p99_met} | "
            f"{s.members - s.dominated} | {s.met} |"
        )
    out += [
        "",
        "| member | GPU-s × ka-10min | p99 − ka-10min s | cold − ka-10min pp | boots | missed |",
        "|:--|--:|--:|--:|--:|:--|",
    ]
    for m, v in new.items():
        b = old[m]
        moved = b.missed != v.missed or abs(v.gpu_ratio - b.gpu_ratio) > 0.005
        if not (moved or abs(v.p99_delta_s - b.p99_delta_s) > 0.05):
            continue
        out.append(
            f"| {m} | {_f(b.gpu_ratio, 3)} → {_f(v.gpu_ratio, 3)} | {b.p99_delta_s:+.2f} → "
            f"{v.p99_delta_s:+.2f} | {_pp(b.cold_delta)} → {_pp(v.cold_delta)} | {b.boots} → "
            f"{v.boots} | {', '.join(b.missed) or '-'} → {', '.join(v.missed) or '-'} |"
        )
    return [*out, ""]


def summary_json(
    by_t: dict[float, list[Verdict]], seed: int, decide_ms: float, members: int
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "bench": "autoscale_family",
        "seed": seed,
        "members": members,
        "t_cold": {},
    }
    for t, verdicts in by_t.items():
        policies = {}
        for c in CONFIGS:
            vs = [v for v in verdicts if v.label == c.label]
            if vs:
                policies[c.label] = _summary_dict(summarize(vs))
        ours = [v for v in verdicts if v.label == "ours"]
        missed = {v.member: list(v.missed) for v in ours if v.missed}
        out["t_cold"][f"{t:g}"] = {
            "policies": policies,
            "ours_missed": missed,
            "ours_family_missed": family_missed(ours),
        }
    out["decide_p99_ms_1000_deployments"] = _round(decide_ms, 2)
    return out


def _summary_dict(s: Summary) -> dict[str, Any]:
    return {
        "gpu_vs_keepalive10_median": _round(s.gpu_median, 3),
        "gpu_vs_keepalive10_worst": [_round(s.gpu_worst[0], 3), s.gpu_worst[1]],
        "p99_minus_keepalive10_median_s": _round(s.p99_median, 2),
        "p99_minus_keepalive10_worst_s": [_round(s.p99_worst[0], 2), s.p99_worst[1]],
        "cold_minus_keepalive10_median": _round(s.cold_median, 4),
        "cold_minus_keepalive10_worst": [_round(s.cold_worst[0], 4), s.cold_worst[1]],
        "dominated_members": s.dominated,
        "all_targets_members": s.met,
        "members": s.members,
    }


def _f(x: float, digits: int) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _pp(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:+.2f}"


def _worst(w: tuple[float, str], digits: int) -> str:
    return f"{_f(w[0], digits)} ({w[1]})"


def _worst_pp(w: tuple[float, str]) -> str:
    return f"{_pp(w[0])} ({w[1]})"


def _round(x: float, digits: int) -> float | None:
    return None if math.isnan(x) else round(x, digits)

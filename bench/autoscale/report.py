"""Printing what the runs found: a table per workload, the Pareto plot, the final JSON line."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.autoscale.metrics import WARMUP_S, RunResult

POLICY_ORDER = ("ours", "keepalive", "kpa", "keda", "histogram", "oracle")
COLUMNS = (
    "policy",
    "T_cold s",
    "cold %",
    "cold p75/dep %",
    "sync p50 s",
    "sync p99 s",
    f"sync p99 >{WARMUP_S / 60:g}min s",
    "async p50 s",
    "async p99 s",
    "GPU-s",
    "used %",
    "boots",
    "GPU-s / keepalive",
)


def table(results: Sequence[RunResult]) -> list[str]:
    """Markdown rows: policies in POLICY_ORDER, each over its T_cold values."""
    keepalive = {r.t_cold_s: r.gpu_s for r in results if r.policy == "keepalive"}
    rows = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(COLUMNS))) + "|",
    ]
    for r in sorted(results, key=lambda r: (_rank(r.policy), r.t_cold_s)):
        ratio = r.gpu_s / keepalive[r.t_cold_s] if keepalive.get(r.t_cold_s) else math.nan
        cells = (
            f"**{r.policy}**" if r.policy == "ours" else r.policy,
            f"{r.t_cold_s:g}",
            f"{100 * r.cold_rate:.2f}",
            _num(100 * r.cold_rate_p75, 1),
            _num(r.sync_p50_s, 2),
            _num(r.sync_p99_s, 2),
            _num(r.sync_p99_warm_s, 2),
            _num(r.async_p50_s, 2),
            _num(r.async_p99_s, 2),
            f"{r.gpu_s:,.0f}",
            f"{100 * r.used_gpu_s / r.gpu_s:.0f}" if r.gpu_s else "-",
            f"{r.boots}",
            _num(ratio, 2),
        )
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def summary(
    results: Iterable[RunResult],
    t_cold_s: float,
    decide_p99_ms: float,
    cold_floors: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The final JSON object: ``ours`` against keep-alive and KPA at `t_cold_s`, per workload;
    `cold_floors`: each workload's cold-start floor at `t_cold_s` (`bound.cold_floor`, as a
    share of its requests)."""
    at: dict[str, dict[str, RunResult]] = {}
    for r in results:
        if r.t_cold_s == t_cold_s:
            at.setdefault(r.workload, {})[r.policy] = r
    workloads: dict[str, Any] = {}
    for name, by in at.items():
        ours, keep, kpa = by.get("ours"), by.get("keepalive"), by.get("kpa")
        if ours is None or keep is None or kpa is None:
            continue
        workloads[name] = {
            "t_cold_s": t_cold_s,
            "gpu_s_vs_keepalive": _round(ours.gpu_s / keep.gpu_s, 3),
            "p99_delay_vs_keepalive_s": _round(ours.sync_p99_s - keep.sync_p99_s, 2),
            "cold_start_rate": _round(ours.cold_rate, 4),
            "boots_vs_kpa": _round(ours.boots / kpa.boots if kpa.boots else math.nan, 3),
        }
        if cold_floors and name in cold_floors:
            workloads[name]["cold_start_floor"] = _round(cold_floors[name], 4)
    return {
        "bench": "autoscale",
        "workloads": workloads,
        "decide_p99_ms_1000_deployments": _round(decide_p99_ms, 2),
    }


def plot_pareto(
    sweeps: dict[str, list[RunResult]],
    t_cold_s: float,
    path: Path,
    subtitle: str,
    cold_floors: dict[str, float] | None = None,
) -> None:
    """GPU-hours against sync p99 delay (top row) and against the cold-start rate (bottom row:
    where p99 saturates at T_cold because > 1 % of requests are cold), one column per workload,
    one line per policy through its knob's values (labelled), the oracle as a star;
    `cold_floors` (share of requests, per workload) drawn as a dashed line under the rates."""
    try:
        import matplotlib
    except ImportError as e:  # an optional dependency (the `bench` extra)
        raise SystemExit(
            "the Pareto plot needs matplotlib: pip install 'platform-serverless[bench]', "
            "or pass --no-plot"
        ) from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(sweeps)
    fig, axes = plt.subplots(2, len(names), figsize=(6.2 * len(names), 9.0), squeeze=False)
    rows: tuple[tuple[str, Callable[[RunResult], float]], ...] = (
        ("sync queueing delay p99 (s)", lambda r: r.sync_p99_s),
        ("cold-start rate (%)", lambda r: 100 * r.cold_rate),
    )
    for col, name in enumerate(names):
        for row, (label, metric) in enumerate(rows):
            ax = axes[row][col]
            _draw(ax, sweeps[name], metric)
            if row == 1 and cold_floors and name in cold_floors:
                ax.axhline(
                    100 * cold_floors[name], color="0.4", ls="--", lw=1, label="scale-to-zero floor"
                )
            ax.set_title(name)
            ax.set_xlabel("GPU-hours provisioned")
            ax.set_ylabel(label)
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_ylim(bottom=-0.25)  # never below 0: just enough room for the oracle at 0
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"T_cold = {t_cold_s:g} s, each policy's main knob swept; {subtitle}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _draw(ax: Any, results: list[RunResult], metric: Callable[[RunResult], float]) -> None:
    colors = dict(zip(POLICY_ORDER, ("C3", "C0", "C1", "C2", "C4", "k"), strict=True))
    by_policy: dict[str, list[RunResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    for policy in sorted(by_policy, key=_rank):
        points = sorted(by_policy[policy], key=lambda r: _knob_key(r.knob))
        xs = [r.gpu_s / 3600 for r in points]
        ys = [metric(r) for r in points]
        if policy == "oracle":
            ax.scatter(xs, ys, marker="*", s=180, color="k", label="oracle", zorder=5)
            continue
        color = colors.get(policy)
        knob = points[0].knob.split("=")[0]
        lw = 2.5 if policy == "ours" else 1.2
        ax.plot(xs, ys, marker="o", color=color, lw=lw, label=f"{policy} ({knob})")
        for r, x, y in zip(points, xs, ys, strict=True):
            value = r.knob.split("=")[-1]
            ax.annotate(
                value, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color
            )


def _rank(policy: str) -> int:
    return POLICY_ORDER.index(policy) if policy in POLICY_ORDER else len(POLICY_ORDER)


def _knob_key(knob: str) -> tuple[float, ...]:
    value = knob.split("=")[-1]
    try:
        return tuple(float(v) for v in value.split("/"))
    except ValueError:
        return ()


def _num(x: float, digits: int) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _round(x: float, digits: int) -> float | None:
    return None if math.isnan(x) else round(x, digits)

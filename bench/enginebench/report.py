"""The tables `bench/engine.py` prints (one per workload: each system at each thread count) and
the ratios of its JSON line."""

from __future__ import annotations

from typing import Any

from bench.enginebench.model import summarize

# (system, threads) -> that run's result (the best round's)
Runs = dict[tuple[str, int], dict[str, Any]]

HEADER = (
    f"{'threads':>7} {'system':<16} {'tok/s':>8} {'wall s':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
    f"{'ITL p50':>8} {'ITL p99':>8} {'RSS MB':>7} {'from zero':>10}  same tokens"
)


def table(
    runs: Runs,
    work: list[tuple[list[int], int]],
    reference: list[list[int]],
    labels: dict[str, str],
) -> dict[tuple[str, int], dict[str, float]]:
    """Print one row per run (tokens compared with ``reference``); return the summaries."""
    print(HEADER)
    rows = {}
    for (system, threads), result in runs.items():
        x = rows[system, threads] = summarize(result, work)
        same = "yes" if result["tokens"] == reference else "NO"
        print(
            f"{threads:>7} {labels.get(system, system):<16} {x['tok_s']:8.1f} {x['wall_s']:7.1f} "
            f"{x['ttft_p50_s']:8.2f}s {x['ttft_p99_s']:8.2f}s {x['itl_p50_ms']:6.0f}ms "
            f"{x['itl_p99_ms']:6.0f}ms {x['peak_rss_mb']:7.0f} {result['cold_s']:9.2f}s  {same}"
        )
    return rows


def best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the shortest wall time; its cold start is the shortest of all rounds'."""
    result = dict(min(rounds, key=lambda r: r["wall_s"]))
    result["cold_s"] = min(r["cold_s"] for r in rounds)
    return result


def worst_ratio(
    ours: dict[int, float], theirs: dict[int, float], higher_is_better: bool = True
) -> float | None:
    """Our value over theirs at each thread count both ran; the worst for us (None if none)."""
    ratios = [ours[t] / theirs[t] for t in ours if t in theirs]
    if not ratios:
        return None
    return round(min(ratios) if higher_is_better else max(ratios), 3)


def by_threads(runs: Runs, system: str, key: str) -> dict[int, float]:
    return {t: float(r[key]) for (s, t), r in runs.items() if s == system}


def tok_s_by_threads(
    rows: dict[tuple[str, int], dict[str, float]], system: str
) -> dict[int, float]:
    return {t: x["tok_s"] for (s, t), x in rows.items() if s == system}

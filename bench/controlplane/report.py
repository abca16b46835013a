"""The bench's tables (admissions, CPU, the warm path) and its last line, one JSON object."""

from __future__ import annotations

import json
import statistics
from typing import Any

from bench.controlplane.measure import CLIENTS


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0 < q < 1) of the values, interpolated (one value: itself)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


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

"""`bench/loader.py --tiers`: the cache tiers, a miss against no tiers, the fill after it,
host and disk hits (with and without fused names), in interleaved rounds."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.loaderbench.checkpoint import BUCKET, KEY, machine, serve_checkpoint
from bench.loaderbench.contenders import ROOT, SCRIPT, run_child

TIER_SCENARIOS = ("no tiers", "miss", "host hit", "host hit, fused", "disk hit", "disk hit, fused")


def tiers_main(args: argparse.Namespace) -> None:
    """Interleaved rounds of the tier scenarios, each load in a fresh process (tiers emptied
    before each "miss", the host tier emptied before each disk hit); a table and JSON."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="bench-tiers-") as tmp:
        root = Path(tmp)
        size, server, s3_env = serve_checkpoint(root, args)
        host = Path("/dev/shm" if os.path.isdir("/dev/shm") else tmp) / f"bench-tiers-{os.getpid()}"
        env = {
            **os.environ,
            **s3_env,
            "AWS_EC2_METADATA_DISABLED": "true",
            "BENCH_HOST_TIER": str(host),
            "BENCH_DISK_TIER": str(root / "disk"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }

        def run(scenario: str) -> dict[str, Any]:
            r = run_child(
                [SCRIPT, "--child", "tier", f"s3://{BUCKET}/{KEY}", str(size)],
                {**env, "BENCH_SCENARIO": scenario},
                scenario,
            )
            hit = scenario.split(" ")[0] if "hit" in scenario else None
            if r["tier_hits"] != ({hit: 1} if hit else {}):
                raise SystemExit(f"{scenario}: read from {r['tier_hits'] or 'the origin'}")
            print(f"  {scenario:16s} {r['seconds']:.2f}s  fill {r['fill_s']:.2f}s", flush=True)
            return r

        results: dict[str, list[dict[str, Any]]] = {k: [] for k in TIER_SCENARIOS}
        try:
            print(f"checkpoint {size / 1e9:.2f} GB -> cpu; machine: {machine()}", flush=True)
            run("no tiers")  # warm-up: rclone hashes the file
            for i in range(args.rounds):
                order = list(TIER_SCENARIOS)  # odd rounds: the miss first, then no tiers
                order[:2] = order[:2] if i % 2 == 0 else order[1::-1]
                for scenario in order:
                    if scenario == "miss":
                        shutil.rmtree(host, ignore_errors=True)
                        shutil.rmtree(root / "disk", ignore_errors=True)
                    if scenario.startswith("disk"):
                        for entry in host.glob("*"):
                            entry.unlink()
                    results[scenario].append(run(scenario))
        finally:
            server.stop()
            shutil.rmtree(host, ignore_errors=True)

    def med(scenario: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[scenario]))

    base = med("no tiers", "seconds")
    print(f"\n{'scenario':16s} {'median s':>9s} {'GB/s':>6s} {'vs no tiers':>11s} {'fill s':>7s}")
    for scenario in TIER_SCENARIOS:
        sec = med(scenario, "seconds")
        fill = med(scenario, "fill_s")
        print(f"{scenario:16s} {sec:9.2f} {size / sec / 1e9:6.2f} {base / sec:11.2f} {fill:7.2f}")
    summary: dict[str, Any] = {"bench": "loader-tiers", "checkpoint_gb": round(size / 1e9, 2)}
    for scenario in TIER_SCENARIOS:
        key = scenario.replace(", ", "_").replace(" ", "_")
        summary[f"gbps_{key}"] = round(size / med(scenario, "seconds") / 1e9, 3)
        summary[f"fill_s_{key}"] = round(med(scenario, "fill_s"), 3)
    print(json.dumps(summary))

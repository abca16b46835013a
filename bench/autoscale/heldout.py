"""Held-out traces: workloads the autoscaler was not designed on, written in the two trace
formats (Azure CSV) so that ``bench/autoscale_sim.py --trace`` runs them like any other.

- ``tiled3_<trace>.csv``: a given trace three times end to end (three hours). On a one-hour
  trace the first boot sets most of the p99 and the cold starts; here it is a third as much,
  so what the policy does in the steady state shows.
- ``bursty<k>.csv``: on/off traffic, three hours, inter-arrival CV above 10 (the target's
  "far burstier" traces): off periods exponential with a mean drawn from 2, 10 or 30 minutes,
  bursts of lognormal size (median 150 requests) at 2-20 req/s, lengths drawn from the Azure
  trace.
- ``cron<k>.csv``: a scheduled batch job, three hours: every 10 or 20 minutes (jitter up to
  2 % of the period) a batch of lognormal size (median 100 requests) submitted at 50 req/s.
  Its next batch is predictable, and bigger than one worker serves during a boot.

    .venv/bin/python -m bench.autoscale.heldout /tmp/heldout
    .venv/bin/python -m bench.autoscale_sim --trace /tmp/heldout/bursty0.csv --no-pareto
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from collections.abc import Iterable
from pathlib import Path

from bench.autoscale.workloads import MIN_BURSTY_CV, interarrival_cv
from bench.traces import WORKLOADS, TraceRequest, read_trace

GIVEN = ("azure_llm_2023_conv.csv", "mooncake_conversation.jsonl")
TILES = 3
BURSTY_SPAN_S = 3 * 3600.0
OFF_MEANS_S = (120.0, 600.0, 1800.0)
CRON_PERIODS_S = (600.0, 1200.0)


def write_csv(path: Path, rows: Iterable[tuple[float, int, int]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t, prompt, output in rows:
            out.writerow([f"{t:.6f}", prompt, output])


def tiled(requests: list[TraceRequest], tiles: int = TILES) -> list[tuple[float, int, int]]:
    span = requests[-1].arrival_s + 1.0
    return [
        (k * span + r.arrival_s, r.prompt_tokens, r.output_tokens)
        for k in range(tiles)
        for r in requests
    ]


def bursty(seed: int, lengths: list[TraceRequest]) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    rows: list[tuple[float, int, int]] = []
    t = 0.0
    while t < BURSTY_SPAN_S:
        t += rng.expovariate(1 / rng.choice(OFF_MEANS_S))
        size = int(rng.lognormvariate(math.log(150), 1.0))
        rate = rng.uniform(2.0, 20.0)
        for _ in range(size):
            t += rng.expovariate(rate)
            r = rng.choice(lengths)
            rows.append((t, r.prompt_tokens, r.output_tokens))
    return rows


def cron(seed: int, period_s: float, lengths: list[TraceRequest]) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    rows: list[tuple[float, int, int]] = []
    at = 0.0
    while at < BURSTY_SPAN_S:
        t = at + rng.uniform(0.0, 0.02 * period_s)
        for _ in range(int(rng.lognormvariate(math.log(100), 0.5))):
            t += rng.expovariate(50.0)
            r = rng.choice(lengths)
            rows.append((t, r.prompt_tokens, r.output_tokens))
        at += period_s
    return rows


def write_all(out: Path, num_bursty: int = 3) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name in GIVEN:
        path = out / f"tiled{TILES}_{Path(name).stem}.csv"
        write_csv(path, tiled(read_trace(WORKLOADS / name)))
        paths.append(path)
    lengths = read_trace(WORKLOADS / GIVEN[0])
    for k in range(num_bursty):
        rows = bursty(100 + k, lengths)
        assert interarrival_cv([t for t, _, _ in rows]) > MIN_BURSTY_CV
        path = out / f"bursty{k}.csv"
        write_csv(path, rows)
        paths.append(path)
    for k, period_s in enumerate(CRON_PERIODS_S):
        path = out / f"cron{k}.csv"
        write_csv(path, cron(200 + k, period_s, lengths))
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the traces to")
    args = parser.parse_args()
    for path in write_all(args.out):
        print(path)


if __name__ == "__main__":
    main()

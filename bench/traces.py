"""Workload traces: read Azure-style CSV and Mooncake-style JSONL request traces.

The traces live beside the project (``../shared/workloads/``), never inside it. Any file in
either format is accepted, told apart by its content.

Example:

    >>> requests = read_trace(WORKLOADS / "azure_llm_2023_conv.csv", limit=32)
    >>> requests[0].prompt_tokens, requests[0].output_tokens
    (374, 44)
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# Traces live beside the project, never inside it.
# `PLATFORM_WORKLOADS_DIR` points elsewhere (a checkout without ../shared beside it).
WORKLOADS = Path(
    os.environ.get("PLATFORM_WORKLOADS_DIR")
    or Path(__file__).resolve().parents[1].parent / "shared" / "workloads"
)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload trace, lengths in the original service's tokens."""

    # seconds after the trace's first request
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # Mooncake: ids of the prompt's 512-token blocks (equal ids = equal content); else ()
    hash_ids: tuple[int, ...] = ()


def read_trace(path: Path, limit: int | None = None) -> list[TraceRequest]:
    """Read an Azure-style CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``) or a Mooncake-style
    JSONL (``{timestamp, input_length, output_length, hash_ids}``), told apart by content."""
    with Path(path).open(encoding="utf-8") as f:
        first = ""
        for line in f:
            if line.strip():
                first = line.strip()
                break
        f.seek(0)
        rows = _read_jsonl(f) if first.startswith("{") else _read_csv(f)
        out: list[TraceRequest] = []
        start: float | None = None
        for t, prompt, output, hash_ids in rows:
            start = t if start is None else start
            out.append(TraceRequest(t - start, prompt, output, hash_ids))
            if limit is not None and len(out) >= limit:
                break
    return out


def _read_jsonl(f: Iterator[str]) -> Iterator[tuple[float, int, int, tuple[int, ...]]]:
    for line in f:
        if line.strip():
            d = json.loads(line)
            hash_ids = tuple(int(h) for h in d.get("hash_ids") or ())
            # Mooncake timestamps are milliseconds
            ts = float(d["timestamp"]) / 1000
            yield ts, int(d["input_length"]), int(d["output_length"]), hash_ids


def _read_csv(f: Iterator[str]) -> Iterator[tuple[float, int, int, tuple[int, ...]]]:
    for row in csv.DictReader(f):
        t = _timestamp_s(row["TIMESTAMP"])
        yield t, int(row["ContextTokens"]), int(row["GeneratedTokens"]), ()


def _timestamp_s(raw: str) -> float:
    raw = raw.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    if "." in raw:  # datetime takes at most 6 fractional digits
        head, frac = raw.split(".", 1)
        raw = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(raw).timestamp()


def clip(value: float, low: int, high: int) -> int:
    return max(low, min(high, int(value)))

"""The phases one cold request waited through, from the platform's own records (pure).

    sent ─accept─▶ created_at ─queue─▶ worker placed ─boot─▶ loading ─load─▶ warming
         ─warm─▶ ready (idle) ─token─▶ first `output` event

A booted worker's billing records start with `boot` (process start → it reports `loading`); a
warm-pool worker's tenant records start with `load` at its assignment (its boot was the
platform's `pool` record, before the request): for it queue ends at the assignment and boot
is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

PHASES = ("accept", "queue", "boot", "load", "warm", "token")


@dataclass(frozen=True, slots=True)
class Timeline:
    """The moments one cold request passed through (unix seconds, one machine's clock)."""

    sent: float  # client: the request left
    accepted: float  # job.created_at: the API stored it
    placed: float  # the reconciler started a worker (boot record starts) or assigned a pool one
    loading: float  # the worker began loading (boot record ends; a pool worker: its assignment)
    warming: float  # load record ends
    ready: float  # warm record ends: the worker is idle
    first_token: float  # client: the first `output` event arrived


def parse_iso(text: str) -> float:
    """Unix seconds of an API timestamp ("2026-01-02T03:04:05.123456Z")."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def timeline(
    sent: float, job: Mapping[str, Any], records: Iterable[Mapping[str, Any]], first_token: float
) -> Timeline:
    """The timeline from the job (`GET /v1/jobs/{id}`) and its worker's billing records (the
    tenant's: a pool worker's has no `boot`, a worker that jobs waited for no `warm`);
    ValueError when its load record is missing."""
    by_phase: dict[str, Mapping[str, Any]] = {}
    for r in records:
        by_phase.setdefault(str(r["phase"]), r)  # the first segment of each phase
    if "load" not in by_phase:
        raise ValueError("no load billing record for the worker")
    load_start = parse_iso(by_phase["load"]["start"])
    boot = by_phase.get("boot")
    # a worker that jobs waited for skips the warm-up: ready when its load ends
    warm = by_phase.get("warm", by_phase["load"])
    return Timeline(
        sent=sent,
        accepted=parse_iso(job["created_at"]),
        placed=load_start if boot is None else parse_iso(boot["start"]),
        loading=load_start if boot is None else parse_iso(boot["end"]),
        warming=parse_iso(by_phase["load"]["end"]),
        ready=parse_iso(warm["end"]),
        first_token=first_token,
    )


def phases(t: Timeline) -> dict[str, float]:
    """Seconds per phase (PHASES) and `total`. Each moment is taken no earlier than the one
    before it, so the phases add up to the total and a worker that was up before the request
    shows 0 for what it had done already."""
    moments = [t.sent, t.accepted, t.placed, t.loading, t.warming, t.ready, t.first_token]
    for i in range(1, len(moments)):
        moments[i] = max(moments[i], moments[i - 1])
    out = {name: moments[i + 1] - moments[i] for i, name in enumerate(PHASES)}
    out["total"] = moments[-1] - moments[0]
    return out

"""The billing plan for one tick: no open segment grows past MAX_SEGMENT_S (a crash loses at most
that much). A worker in a billed phase for that long has its segment closed at its last sign of
life and continues in a new one; a silent worker's time is not billed on trust.

How a closed busy segment is split among the attempts it served is `domain.allocation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from common.protocol import WorkerState
from control_plane.domain.billing_math import phase_of
from control_plane.domain.plans.actions import RollSegment

MAX_SEGMENT_S = 60.0


@dataclass(frozen=True, slots=True)
class OpenSegment:
    """A live worker's current phase, as its row says."""

    worker_id: str
    state: WorkerState
    pooled: bool  # a warm-pool worker with no deployment yet
    state_since: datetime  # its open segment's start
    last_heartbeat_at: datetime | None


def plan_rolls(workers: list[OpenSegment], now: datetime) -> list[RollSegment]:
    out = []
    for w in workers:
        phase = phase_of(w.state, pooled=w.pooled)
        if phase is None or (now - w.state_since).total_seconds() < MAX_SEGMENT_S:
            continue
        # Only up to the last sign of life: a silent worker's time is not billed on trust.
        end = min(now, w.last_heartbeat_at or w.state_since)
        if end - w.state_since >= timedelta(seconds=MAX_SEGMENT_S / 2):
            out.append(RollSegment(w.worker_id, phase, w.state_since, end))
    return out

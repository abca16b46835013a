"""The batch plan for one tick: a running batch whose lines have all ended completes; else its
free slots (`max_in_flight` less the lines in flight) go to its waiting lines.

NOTE: a line is in flight when it runs, or is pending with a slot (`dispatched_at` set); a
pending line without one waits for a slot and gets no wake-up from anyone else.
"""

from __future__ import annotations

from dataclasses import dataclass

from control_plane.domain.plans.actions import CompleteBatch, DispatchLines


@dataclass(frozen=True, slots=True)
class BatchLoad:
    """One running batch's active lines."""

    batch_id: str
    deployment_id: str
    max_in_flight: int
    in_flight: int  # running, or pending with a slot
    waiting: int  # pending without a slot


def plan_batch(b: BatchLoad) -> list[CompleteBatch | DispatchLines]:
    if b.in_flight == 0 and b.waiting == 0:
        return [CompleteBatch(b.batch_id)]
    free = b.max_in_flight - b.in_flight
    if free <= 0 or b.waiting == 0:
        return []
    return [DispatchLines(b.batch_id, b.deployment_id, min(free, b.waiting))]

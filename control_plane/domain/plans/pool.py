"""The warm pool's plan for one tick: per accelerator type, boot pool workers toward the target
`pool.targets` sets (one at a time after failed boots, after their backoff; none while a cold
start is under way), or stop the surplus, booting ones first (an idle one is ready to serve)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from common.protocol import WorkerState
from control_plane.domain import pool as pool_policy
from control_plane.domain.crash_loop import BootHistory
from control_plane.domain.plans.actions import BootPoolWorker, StopWorker

# The reason recorded on a pool worker stopped because the pool shrinks (a worker asked to
# stop is never handed out).
SHRINK = "pool_shrink"


@dataclass(frozen=True, slots=True)
class PoolWorker:
    """A pool worker (no deployment yet), not draining."""

    id: str
    accelerator: str
    state: WorkerState


def wants_history(target: int, pooled: int, cold_start_under_way: bool) -> bool:
    """Whether the pool's boot history matters (it would grow): read only then."""
    return pooled < target and not cold_start_under_way


def plan_pool(
    targets: dict[str, pool_policy.PoolTarget],
    pooled: Sequence[PoolWorker],
    cold_start_under_way: bool,
    history: BootHistory | None,
    now: datetime,
) -> list[BootPoolWorker | StopWorker]:
    """Boots and stops toward each type's target; `history`: the pool's recent boots, given
    when `wants_history` says some type would grow."""
    actions: list[BootPoolWorker | StopWorker] = []
    for accelerator in sorted(set(targets) | {w.accelerator for w in pooled}):
        target = targets.get(accelerator)
        mine = [w for w in pooled if w.accelerator == accelerator]
        size = target.size if target else 0

        def past() -> BootHistory:
            assert history is not None, "a pool that grows reads its history first"
            return history

        step = pool_policy.plan(size, len(mine), cold_start_under_way, past, now)
        why = target.reason if target else "no_deployments"
        expected = target.expected_cold_starts if target else 0.0
        actions += [BootPoolWorker(accelerator, size, why, expected)] * step.start
        victims = sorted(mine, key=lambda w: w.state == WorkerState.IDLE)[: step.stop]
        actions += [StopWorker(w.id, None, SHRINK) for w in victims]
    return actions

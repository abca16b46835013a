"""The warm pool's plan for one tick: per accelerator type and engine, boot pool workers toward
the target `pool.targets` sets (one at a time after that pool's failed boots, after their
backoff; none while a cold start is under way), or stop the surplus, booting ones first (an
idle one is ready to serve)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from common.protocol import WorkerState
from control_plane.domain import pool as pool_policy
from control_plane.domain.crash_loop import BootHistory
from control_plane.domain.plans.actions import BootPoolWorker, StopWorker

# The reason recorded on a pool worker stopped because the pool shrinks (a worker asked to
# stop is never handed out).
SHRINK = "pool_shrink"

# One pool: an accelerator type's workers of one engine.
PoolKey = tuple[str, str]  # (accelerator, engine)


@dataclass(frozen=True, slots=True)
class PoolWorker:
    """A pool worker (no deployment yet), not draining."""

    id: str
    accelerator: str
    state: WorkerState
    engine: str = pool_policy.BUILTIN  # the engine it prepared at its boot

    @property
    def key(self) -> PoolKey:
        return (self.accelerator, self.engine)


def wants_history(target: int, pooled: int, cold_start_under_way: bool) -> bool:
    """Whether a pool's boot history matters (it would grow): read only then."""
    return pooled < target and not cold_start_under_way


def growing_engines(
    targets: Mapping[PoolKey, pool_policy.PoolTarget],
    pooled: Sequence[PoolWorker],
    cold_start_under_way: bool,
) -> set[str]:
    """The engines some pool of which would grow: their boot histories are read."""
    return {
        engine
        for (accelerator, engine), t in targets.items()
        if wants_history(
            t.size,
            sum(1 for w in pooled if w.key == (accelerator, engine)),
            cold_start_under_way,
        )
    }


def plan_pool(
    targets: Mapping[PoolKey, pool_policy.PoolTarget],
    pooled: Sequence[PoolWorker],
    cold_start_under_way: bool,
    history: Mapping[str, BootHistory],
    now: datetime,
) -> list[BootPoolWorker | StopWorker]:
    """Boots and stops toward each pool's target; `history`: per engine, its pool workers'
    recent boots, given for the engines `growing_engines` names (a broken vLLM environment
    backs off vLLM's pools, not the built-in ones)."""
    actions: list[BootPoolWorker | StopWorker] = []
    for key in sorted(set(targets) | {w.key for w in pooled}):
        accelerator, engine = key
        target = targets.get(key)
        mine = [w for w in pooled if w.key == key]
        size = target.size if target else 0

        def past(engine: str = engine) -> BootHistory:
            assert engine in history, "a pool that grows reads its history first"
            return history[engine]

        step = pool_policy.plan(size, len(mine), cold_start_under_way, past, now)
        why = target.reason if target else "no_deployments"
        expected = target.expected_cold_starts if target else 0.0
        actions += [BootPoolWorker(accelerator, engine, size, why, expected)] * step.start
        victims = sorted(mine, key=lambda w: w.state == WorkerState.IDLE)[: step.stop]
        actions += [StopWorker(w.id, None, SHRINK) for w in victims]
    return actions

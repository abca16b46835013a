"""The warm pool in the reconciler: what idle pool workers a tick may hand out, and keeping
the pool at the size `domain.pool.targets` asks for.

    read_free(...)  the idle pool workers, with what their hosts' memory tiers hold: the
                    scaling plans place a deployment's new worker on one of them when that is
                    faster than a boot (`domain.placement`); the actuator assigns it
                    (`worker_actions.start`)
    keep(...)       boots / stops pool workers toward the target per accelerator type
                    (`domain/plans/pool.py`)

A pool worker is assigned at most once (`services.workers.worker_records.assign` is a conditional
update) and never returns to the pool. If the assignment cannot be sent, the worker is killed and
failed: the job goes on waiting and the next tick places it again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from common.protocol import (
    HEARTBEAT_HOST_TIER_FIELD,
    WorkerState,
    worker_heartbeat_key,
)
from control_plane.db.models import Worker
from control_plane.domain import pool as pool_policy
from control_plane.domain.crash_loop import BootHistory, PastWorker, history_of
from control_plane.domain.placement import PoolCandidate
from control_plane.domain.plans.pool import SHRINK, PoolWorker, plan_pool, wants_history
from control_plane.domain.scaling.policy import DEFAULT_BOOT_S
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.reconcile.refresh import Measured
from control_plane.services import deployments
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)


@dataclass
class FreePool:
    """The idle pool workers one tick may still hand out, with what their hosts hold."""

    idle: list[Worker] = field(default_factory=list)
    host_tier: dict[str, frozenset[str]] = field(default_factory=dict)  # worker id → URIs

    def candidates(self, accelerator: str, model_uri: str) -> list[PoolCandidate]:
        prefix = model_uri.rstrip("/") + "/"
        return [
            PoolCandidate(
                w.id,
                holds_model=any(u.startswith(prefix) for u in self.host_tier.get(w.id, ())),
            )
            for w in self.idle
            if w.accelerator == accelerator
        ]

    def taken(self, worker_ids: set[str]) -> None:
        """These were handed out: no longer free this tick."""
        self.idle = [w for w in self.idle if w.id not in worker_ids]


def read_free(session: Session, r: redis.Redis) -> FreePool:
    idle = [w for w in worker_records.idle_pooled(session) if w.reason != SHRINK]
    tiers: dict[str, frozenset[str]] = {}
    if idle:
        try:
            beats = r.mget([worker_heartbeat_key(w.id) for w in idle])
        except redis.RedisError:
            beats = [None] * len(idle)
        for w, beat in zip(idle, beats, strict=True):
            tiers[w.id] = _host_tier(beat)
    return FreePool(idle, tiers)


def _host_tier(beat: Any) -> frozenset[str]:
    if beat is None:
        return frozenset()
    try:
        uris = json.loads(beat).get(HEARTBEAT_HOST_TIER_FIELD) or []
        return frozenset(u for u in uris if isinstance(u, str))
    except (ValueError, AttributeError):
        return frozenset()


def keep(
    session: Session,
    env: Env,
    measured: Callable[[str], Measured | None],
    now: datetime,
) -> None:
    """Boot or stop pool workers toward each accelerator type's target (`plans/pool.py`)."""
    all_live = worker_records.live(session)
    pooled = [
        PoolWorker(w.id, w.accelerator, WorkerState(w.state))
        for w in all_live
        if w.deployment_id is None and w.state != WorkerState.DRAINING
    ]
    if not env.settings.warm_pool_max and not pooled:
        return  # no pool, none to stop: nothing to size
    serving = [w for w in all_live if w.deployment_id is not None]
    targets = _targets(session, env, measured, serving, now)
    # a pool worker's started_at is its assignment
    under_way = pool_policy.cold_start_under_way(
        ((WorkerState(w.state), w.started_at) for w in serving), now
    )
    grows = any(
        wants_history(t.size, sum(1 for w in pooled if w.accelerator == a), under_way)
        for a, t in targets.items()
    )
    history = _pool_history(session) if grows else None  # a query: only when growing
    act = Actuator(session, env, now)
    act.apply(plan_pool(targets, pooled, under_way, history, now))
    act.commit()


def _targets(
    session: Session,
    env: Env,
    measured: Callable[[str], Measured | None],
    serving: list[Worker],
    now: datetime,
) -> dict[str, pool_policy.PoolTarget]:
    """Each accelerator type's pool target: the cold starts the live deployments' forecasts
    expect over a boot, within what the types' free capacity allows."""
    outlooks, boots = [], []
    t = now.timestamp()
    live = deployments.list_live(session)
    for dep in live:
        if not pool_policy.serves(dep.engine_resolved):
            # it boots its own workers (vLLM's): neither its cold starts nor its boot times
            # are the pool's
            continue
        m = measured(dep.id)
        if m is not None:
            boots.append(m.boot_s)
        rate = 0.0
        if m is not None and m.models.forecast is not None:
            rate = m.models.forecast.rate(t)[0]
        capacity = sum(1 for w in serving if w.deployment_id == dep.id)
        outlooks.append(pool_policy.Outlook(dep.spec.accelerator, capacity, rate))
    # a worker holds its deployment's accelerator_count (vLLM's tensor parallelism)
    count = {dep.id: dep.spec.accelerator_count for dep in live}
    held: dict[str, int] = {}
    for w in serving:
        n = count.get(w.deployment_id or "", 1)
        held[w.accelerator] = held.get(w.accelerator, 0) + n
    free = {a: n - held.get(a, 0) for a, n in env.settings.accelerators.items()}
    budget = pool_policy.Budget(env.settings.warm_pool_max, free)
    horizon = max(boots, default=DEFAULT_BOOT_S)
    return {t.accelerator: t for t in pool_policy.targets(outlooks, horizon, budget)}


def _pool_history(session: Session) -> BootHistory:
    """Crash-loop history of pool boots: the newest pool workers, newest first; one that got
    to the pool (idle) or was assigned booted fine."""
    rows = session.scalars(
        select(Worker)
        .where((Worker.deployment_id.is_(None)) | (Worker.assigned_at.is_not(None)))
        .order_by(Worker.id.desc())  # ids start with their creation time
        .limit(10)
    )
    past = [
        PastWorker(
            failed=w.state == WorkerState.FAILED and w.deployment_id is None,
            served=w.assigned_at is not None,
            stopped_at=w.stopped_at,
            reason=w.reason,
        )
        for w in rows
    ]
    return history_of(past)

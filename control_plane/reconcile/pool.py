"""The warm pool in the reconciler: hand idle pool workers to cold starts, and keep the pool
at the size `domain.pool.targets` asks for.

    scale.scale_all ──► FreePool.take(...)   a deployment needing a worker takes an idle pool
                        (domain.placement)    worker when that is faster than a boot: the row
                                              is assigned (SQL, committed), then the worker
                                              pops its `Assignment` from Redis
    keep(...)       ──► boots / stops pool workers toward the target per accelerator type

A pool worker is assigned at most once (`services.workers.worker_records.assign` is a conditional
update) and never returns to the pool. If the assignment cannot be sent, the worker is killed and
failed: the job goes on waiting and the next tick places it again.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from common.messages import Assignment
from common.protocol import (
    ASSIGNMENT_TTL_S,
    HEARTBEAT_HOST_TIER_FIELD,
    WorkerState,
    worker_assignment_key,
    worker_heartbeat_key,
)
from control_plane.db.models import Worker
from control_plane.domain import pool as pool_policy
from control_plane.domain.crash_loop import BootHistory, PastWorker, history_of
from control_plane.domain.placement import PoolCandidate
from control_plane.domain.scaling.policy import DEFAULT_BOOT_S
from control_plane.providers.base import WorkerSpec
from control_plane.reconcile import tick_trace
from control_plane.reconcile.env import Env
from control_plane.reconcile.refresh import Measured
from control_plane.services import deployments
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)
SHRINK = "pool_shrink"


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

    def take(self, worker_id: str) -> Worker:
        w = next(w for w in self.idle if w.id == worker_id)
        self.idle.remove(w)
        return w


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


def send(env: Env, w: Worker, assignment: Assignment, now: datetime) -> bool:
    """Hand an assigned pool worker its assignment; on failure it is killed and failed."""
    key = worker_assignment_key(w.id)
    try:
        with env.redis.pipeline() as pipe:
            pipe.delete(key)
            pipe.rpush(key, assignment.to_json())
            pipe.expire(key, ASSIGNMENT_TTL_S)
            pipe.execute()
        return True
    except redis.RedisError as exc:
        log.warning("assignment of pool worker %s not sent (Redis: %s); failing it", w.id, exc)
        env.provider.kill(w.id)
        return False


def keep(
    session: Session,
    env: Env,
    measured: Callable[[str], Measured | None],
    now: datetime,
) -> None:
    """Boot or stop pool workers toward each accelerator type's target."""
    all_live = worker_records.live(session)
    pooled = [w for w in all_live if w.deployment_id is None and w.state != WorkerState.DRAINING]
    if not env.settings.warm_pool_max and not pooled:
        return  # no pool, none to stop: nothing to size
    live_deps = deployments.list_live(session)
    serving = [w for w in all_live if w.deployment_id is not None]
    outlooks, boots = [], []
    t = now.timestamp()
    for dep in live_deps:
        m = measured(dep.id)
        rate = 0.0
        if m is not None and m.models.forecast is not None:
            rate = m.models.forecast.rate(t)[0]
        if m is not None:
            boots.append(m.boot_s)
        capacity = sum(1 for w in serving if w.deployment_id == dep.id)
        outlooks.append(pool_policy.Outlook(dep.spec.accelerator, capacity, rate))
    held: dict[str, int] = {}
    for w in serving:
        held[w.accelerator] = held.get(w.accelerator, 0) + 1
    free = {a: n - held.get(a, 0) for a, n in env.settings.accelerators.items()}
    budget = pool_policy.Budget(env.settings.warm_pool_max, free)
    horizon = max(boots, default=DEFAULT_BOOT_S)
    targets = {t.accelerator: t for t in pool_policy.targets(outlooks, horizon, budget)}
    # a pool worker's started_at is its assignment
    under_way = pool_policy.cold_start_under_way(
        ((WorkerState(w.state), w.started_at) for w in serving), now
    )
    history = functools.cache(lambda: _pool_history(session))  # a query: only when growing
    for accelerator in sorted(set(targets) | {w.accelerator for w in pooled}):
        target = targets.get(accelerator)
        mine = [w for w in pooled if w.accelerator == accelerator]
        size = target.size if target else 0
        step = pool_policy.plan(size, len(mine), under_way, history, now)
        for _ in range(step.start):
            w = worker_records.create(session, None, accelerator, worker_records.POOL_REASON, now)
            session.flush()
            w.pid = env.provider.start(WorkerSpec(w.id, accelerator, None))
            tick_trace.note(
                "pool.start",
                **{"platform.worker.id": w.id, "platform.worker.accelerator": accelerator},
            )
            log.info(
                "warm pool (%s): booting %s (target %d: %s, %.3f cold starts expected)",
                accelerator,
                w.id,
                size,
                target.reason if target else "no_deployments",
                target.expected_cold_starts if target else 0.0,
                extra={"worker_id": w.id, "reason": worker_records.POOL_REASON},
            )
        # booting ones first: an idle one is ready to serve
        victims = sorted(mine, key=lambda w: w.state == WorkerState.IDLE)[: step.stop]
        for w in victims:
            log.info(
                "warm pool (%s): stopping %s (target %d)",
                accelerator,
                w.id,
                size,
                extra={"worker_id": w.id, "reason": SHRINK},
            )
            w.reason = SHRINK
            env.provider.stop(w.id)
            tick_trace.note("pool.stop", **{"platform.worker.id": w.id})
    session.commit()


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

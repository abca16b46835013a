"""The warm pool in the reconciler: what idle pool workers a tick may hand out, and keeping
the pool at the size `domain.pool.targets` asks for.

    read_free(...)  the idle pool workers, with what their hosts' memory tiers hold: the
                    scaling plans place a deployment's new worker on one of them when that is
                    faster than a boot (`domain.placement`); the actuator assigns it
                    (`worker_actions.start`)
    keep(...)       boots / stops pool workers toward the target per accelerator type and
                    engine (`domain/plans/pool.py`); vLLM's pools only on a platform that has
                    vLLM (`Settings.has_vllm`)

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
from control_plane.domain.plans.pool import (
    SHRINK,
    PoolKey,
    PoolWorker,
    growing_engines,
    plan_pool,
)
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

    def candidates(self, accelerator: str, engine: str, model_uri: str) -> list[PoolCandidate]:
        """The idle pool workers a deployment of this type and engine may take (a pool worker
        prepared one engine: `pool.serves`)."""
        prefix = model_uri.rstrip("/") + "/"
        return [
            PoolCandidate(
                w.id,
                holds_model=any(u.startswith(prefix) for u in self.host_tier.get(w.id, ())),
            )
            for w in self.idle
            if w.accelerator == accelerator and pool_policy.serves(w.engine, engine)
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
    """Boot or stop pool workers toward each pool's target (`plans/pool.py`)."""
    all_live = worker_records.live(session)
    pooled = [
        PoolWorker(w.id, w.accelerator, WorkerState(w.state), w.engine)
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
    # a query per engine whose pools grow: only then
    history = {e: _pool_history(session, e) for e in growing_engines(targets, pooled, under_way)}
    act = Actuator(session, env, now)
    act.apply(plan_pool(targets, pooled, under_way, history, now))
    act.commit()


def _targets(
    session: Session,
    env: Env,
    measured: Callable[[str], Measured | None],
    serving: list[Worker],
    now: datetime,
) -> dict[PoolKey, pool_policy.PoolTarget]:
    """Each pool's target (accelerator type, engine): the cold starts the live deployments'
    forecasts expect over a boot of that engine, within what the types' free capacity
    allows."""
    outlooks = []
    boots: dict[str, list[float]] = {}
    t = now.timestamp()
    live = deployments.list_live(session)
    pooled_engines = {pool_policy.BUILTIN} | (
        {pool_policy.VLLM} if env.settings.has_vllm() else set()
    )
    for dep in live:
        engine = dep.engine_resolved
        if engine not in pooled_engines or not pool_policy.takes_pool_worker(
            dep.spec.accelerator_count
        ):
            # it boots its own workers (several accelerators each, or an engine this platform
            # keeps no pool of): neither its cold starts nor its boot times are a pool's
            continue
        m = measured(dep.id)
        if m is not None:
            boots.setdefault(engine, []).append(m.boot_s)
        rate = 0.0
        if m is not None and m.models.forecast is not None:
            rate = m.models.forecast.rate(t)[0]
        capacity = sum(1 for w in serving if w.deployment_id == dep.id)
        outlooks.append(pool_policy.Outlook(dep.spec.accelerator, capacity, rate, engine))
    # a worker holds its deployment's accelerator_count (vLLM's tensor parallelism)
    count = {dep.id: dep.spec.accelerator_count for dep in live}
    held: dict[str, int] = {}
    for w in serving:
        n = count.get(w.deployment_id or "", 1)
        held[w.accelerator] = held.get(w.accelerator, 0) + n
    free = {a: n - held.get(a, 0) for a, n in env.settings.accelerators.items()}
    budget = pool_policy.Budget(env.settings.warm_pool_max, free)
    # an engine's pool is refilled in a boot of that engine (vLLM's imports make it longer)
    horizons = {e: max(boots.get(e, ()), default=DEFAULT_BOOT_S) for e in pooled_engines}
    return {(t.accelerator, t.engine): t for t in pool_policy.targets(outlooks, horizons, budget)}


def _pool_history(session: Session, engine: str) -> BootHistory:
    """Crash-loop history of the boots of `engine`'s pool workers: the newest, newest first;
    one that got to the pool (idle) or was assigned booted fine."""
    rows = session.scalars(
        select(Worker)
        .where((Worker.deployment_id.is_(None)) | (Worker.assigned_at.is_not(None)))
        .where(Worker.engine == engine)
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

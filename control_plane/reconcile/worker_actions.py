"""How the actuator carries out the actions on workers: the provider calls and the rows they
change. Every start, stop and kill of the reconciler goes through here.

A start takes the idle pool worker its placement chose when it can still be assigned (the row
is assigned and committed, then the worker pops its `Assignment` from Redis; one whose
assignment cannot be sent is killed and failed), else it boots a new worker.
"""

from __future__ import annotations

import logging
from datetime import datetime

import redis
from sqlalchemy.orm import Session

from common import tracing
from common.messages import Assignment
from common.protocol import ASSIGNMENT_TTL_S, WorkerState, deployment_queue, worker_assignment_key
from control_plane.db.models import Deployment, Worker
from control_plane.domain import pool as pool_policy
from control_plane.domain.placement import BOOT, Placement
from control_plane.domain.plans import actions as a
from control_plane.errors import InvalidRequest
from control_plane.providers.base import WorkerSpec
from control_plane.reconcile import tick_trace
from control_plane.reconcile.env import Env
from control_plane.services.storage import storage_access
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)


def record_exit(session: Session, env: Env, x: a.RecordExit, now: datetime) -> None:
    tick_trace.note(
        "worker.exited",
        **{"platform.worker.id": x.worker_id, "platform.worker.exit_code": x.exit_code},
    )
    if x.exit_code == 0:
        state, reason = WorkerState.STOPPED, None
    else:
        state, reason = WorkerState.FAILED, x.reason or f"exit_{x.exit_code}"
        log.warning(
            "worker %s exited with %d",
            x.worker_id,
            x.exit_code,
            extra={"worker_id": x.worker_id, "reason": reason},
        )
    worker_records.transition(
        session,
        env.settings,
        x.worker_id,
        state,
        x.ended_at,
        now,
        reason,
        note="heartbeat" if x.exit_code != 0 else None,
    )


def lose(session: Session, env: Env, x: a.LoseWorker, now: datetime) -> None:
    log.warning(
        "worker %s failed: %s",
        x.worker_id,
        x.reason,
        extra={"worker_id": x.worker_id, "deployment_id": x.deployment_id, "reason": x.reason},
    )
    env.provider.kill(x.worker_id)
    tick_trace.note(
        "worker.lost", **{"platform.worker.id": x.worker_id, "platform.worker.reason": x.reason}
    )
    worker_records.transition(
        session,
        env.settings,
        x.worker_id,
        WorkerState.FAILED,
        x.ended_at,
        now,
        reason=x.reason,
        note="heartbeat" if x.reason == "heartbeat_lost" else None,
    )


def stop(session: Session, env: Env, x: a.StopWorker) -> None:
    """A drain (SIGTERM): the worker finishes the jobs it holds, then exits."""
    log.info(
        "stopping worker %s (%s)",
        x.worker_id,
        x.reason,
        extra={"worker_id": x.worker_id, "deployment_id": x.deployment_id, "reason": x.reason},
    )
    w = session.get(Worker, x.worker_id)
    if w is not None:
        w.reason = x.reason
    env.provider.stop(x.worker_id)
    name = "worker.stop" if x.deployment_id is not None else "pool.stop"
    tick_trace.note(name, **{"platform.worker.id": x.worker_id, "platform.worker.reason": x.reason})


def start(session: Session, env: Env, x: a.StartWorker, now: datetime) -> tuple[Worker, Placement]:
    """A worker for the deployment (see the module doc); with the placement it got."""
    dep = session.get(Deployment, x.deployment_id)
    assert dep is not None, "a live deployment the plan read"
    assignment = _assignment(session, env, dep)
    placement = x.placement
    new = None
    if placement.worker_id is not None and not pool_policy.takes_pool_worker(
        assignment.accelerator_count
    ):
        # NOTE: the plan never does this (plans/scale.py); a pool worker holds one accelerator,
        # so whatever chose one, a deployment over several boots its own.
        placement = _as_boot(placement)
    if placement.worker_id is not None:
        new = _assign(session, env, placement, dep, assignment, x.reason, now)
        if new is None:  # gone from the pool meanwhile (or on another engine): a boot, then
            placement = _as_boot(placement)
    if new is None:
        spec = dep.spec
        new = worker_records.create(session, dep, spec.accelerator, x.reason, now)
        session.flush()
        new.pid = env.provider.start(WorkerSpec(new.id, spec.accelerator, assignment))
        log.info(
            "started worker %s for %s [%s] (%s)",
            new.id,
            dep.name,
            placement.reason,
            x.reason,
            extra={"worker_id": new.id, "deployment_id": dep.id, "reason": x.reason},
        )
    tick_trace.note(
        "worker.start",
        **{
            "platform.worker.id": new.id,
            tracing.DEPLOYMENT_ID: dep.id,
            "platform.worker.reason": x.reason,
            "platform.worker.placement": placement.reason,
        },
    )
    return new, placement


def boot_pool_worker(session: Session, env: Env, x: a.BootPoolWorker, now: datetime) -> None:
    w = worker_records.create(
        session, None, x.accelerator, worker_records.POOL_REASON, now, pool_engine=x.engine
    )
    session.flush()
    w.pid = env.provider.start(WorkerSpec(w.id, x.accelerator, None, pool_engine=x.engine))
    tick_trace.note(
        "pool.start",
        **{
            "platform.worker.id": w.id,
            "platform.worker.accelerator": x.accelerator,
            "platform.worker.engine": x.engine,
        },
    )
    log.info(
        "warm pool (%s, %s): booting %s (target %d: %s, %.3f cold starts expected)",
        x.accelerator,
        x.engine,
        w.id,
        x.target,
        x.why,
        x.expected_cold_starts,
        extra={"worker_id": w.id, "reason": worker_records.POOL_REASON},
    )


def _assignment(session: Session, env: Env, dep: Deployment) -> Assignment:
    spec = dep.spec
    model_uri, storage_env = spec.model, {}
    try:
        access = storage_access.resolve(session, env.settings, dep.tenant_id, spec.model)
        model_uri, storage_env = access.uri, access.worker_env(storage_access.platform_env())
    except InvalidRequest as exc:
        # A spec accepted before its tenant lost access (or before the rules existed): the
        # worker gets no credentials, fails to read, and the crash-loop gate says why.
        log.warning(
            "deployment %s: model not readable by its tenant: %s",
            dep.id,
            exc.detail,
            extra={"deployment_id": dep.id},
        )
    return Assignment(
        deployment_id=dep.id,
        deployment_version=dep.version,
        model_uri=model_uri,
        queue=deployment_queue(dep.id),
        max_concurrency=spec.target_concurrency,
        storage_env=dict(storage_env),
        # chosen at deploy time (domain/engine_choice.py), with the spec's current version
        engine=dep.engine_resolved,
        accelerator_count=spec.accelerator_count,
    )


def _assign(
    session: Session,
    env: Env,
    placement: Placement,
    dep: Deployment,
    assignment: Assignment,
    reason: str,
    now: datetime,
) -> Worker | None:
    """The idle pool worker assigned to `dep` and sent its assignment; None when it was no
    longer an idle pool worker (it stays as it is), or when its assignment could not be sent
    (then it is killed and failed: the next tick places the work again)."""
    w = session.get(Worker, placement.worker_id)
    if w is None or not worker_records.assign(session, env.settings, w, dep, reason, now):
        return None
    session.commit()  # the worker acts on its assignment only once it is recorded
    if _send(env, w, assignment):
        log.info(
            "assigned pool worker %s to %s [%s] (%s)",
            w.id,
            dep.name,
            placement.reason,
            reason,
            extra={"worker_id": w.id, "deployment_id": dep.id, "reason": reason},
        )
        return w
    worker_records.transition(
        session, env.settings, w.id, WorkerState.FAILED, now, now, "assignment_not_sent"
    )
    return None


def _send(env: Env, w: Worker, assignment: Assignment) -> bool:
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


def _as_boot(placement: Placement) -> Placement:
    """The same estimates' boot option (always among a placement's options)."""
    boot = next(o for o in placement.options if o.choice == BOOT)
    return Placement(BOOT, None, boot.eta_s, (boot,))

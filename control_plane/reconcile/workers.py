"""Reconcilers of workers: reap exited processes, fail workers that went silent or overran
their boot (both planned in `domain/plans/workers.py`; both return the ids of the workers that
died this tick, whose running jobs `jobs.requeue_orphans` then hands back to the queue), and
make busy workers whose jobs all ended idle."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from common.protocol import HEARTBEAT_TTL_S, WorkerState, worker_heartbeat_key
from control_plane.db.models import Deployment, JobAttempt, Worker
from control_plane.domain.plans.actions import LoseWorker
from control_plane.domain.plans.workers import (
    ExitedWorker,
    LiveWorker,
    plan_exits,
    plan_liveness,
)
from control_plane.domain.spec import Spec
from control_plane.reconcile import tick_trace
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.services import deployments
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)
# A worker without a heartbeat for HEARTBEAT_TTL_S is lost, once it had time to send one.
HEARTBEAT_GRACE_S = 2 * HEARTBEAT_TTL_S
# A warm-pool worker (no deployment, so no spec's max_boot_s) that has not booted by then is lost.
POOL_MAX_BOOT_S = 600.0


def reap(session: Session, env: Env, now: datetime) -> list[str]:
    """Workers whose process ended: stopped (exit 0) or failed (any other status); returns
    their ids (their running jobs go back to the queue)."""
    ends = env.provider.reap()
    exited = [(e.worker_id, e.returncode) for e in ends]
    reasons = {e.worker_id: e.reason for e in ends if e.reason}
    activity = _last_activity(session, [w for w, code in exited if code != 0])
    known = {
        w.id: ExitedWorker(w.last_heartbeat_at, w.state_since, activity.get(w.id))
        for worker_id, _ in exited
        if (w := session.get(Worker, worker_id)) is not None
    }
    act = Actuator(session, env, now)
    act.apply(plan_exits(exited, known, now, reasons))
    act.commit()
    return [w for w, _ in exited]


def _last_activity(session: Session, worker_ids: list[str]) -> dict[str, datetime]:
    """Each worker's latest claim or attempt end (a sign of life between its heartbeats)."""
    if not worker_ids:
        return {}
    rows = session.execute(
        select(
            JobAttempt.worker_id,
            func.max(JobAttempt.started_at),
            func.max(JobAttempt.ended_at),
        )
        .where(JobAttempt.worker_id.in_(worker_ids))
        .group_by(JobAttempt.worker_id)
    ).all()
    return {w: max(t for t in (started, ended) if t is not None) for w, started, ended in rows}


def check_liveness(session: Session, env: Env, now: datetime) -> list[str]:
    """Record heartbeats; kill and fail the workers `fleet.liveness` says are lost; returns
    their ids."""
    live = worker_records.live(session)
    beats = env.redis.mget([worker_heartbeat_key(w.id) for w in live]) if live else []
    max_boot_s = _max_boot_s(session, {w.deployment_id for w in live if w.deployment_id})
    views = [
        LiveWorker(
            id=w.id,
            deployment_id=w.deployment_id,
            state=WorkerState(w.state),
            started_at=w.started_at,
            state_since=w.state_since,
            last_heartbeat_at=w.last_heartbeat_at,
            beat_at=None if beat is None else _beat_time(beat, now),
            max_boot_s=max_boot_s.get(w.deployment_id or "", POOL_MAX_BOOT_S),
        )
        for w, beat in zip(live, beats, strict=True)
    ]
    actions = plan_liveness(views, HEARTBEAT_GRACE_S, now)
    act = Actuator(session, env, now)
    act.apply(actions)
    act.commit()
    return [x.worker_id for x in actions if isinstance(x, LoseWorker)]


def settle_idle(session: Session, env: Env, now: datetime) -> None:
    """Busy workers whose last job ended are idle again (a job's end leaves its worker busy:
    `services.workers.worker_records.settle_idle`); before the scaling step, which counts idle
    workers."""
    for worker_id in worker_records.settle_idle(session, env.settings, now):
        tick_trace.note("worker.idle", **{"platform.worker.id": worker_id})
    session.commit()


def _max_boot_s(session: Session, deployment_ids: set[str]) -> dict[str, float]:
    """Each deployment's boot limit: from the live deployments the tick keeps (`list_live`),
    and in one query for the rest (workers of deleted deployments, draining)."""
    limits = {d.id: d.spec.max_boot_s for d in deployments.list_live(session)}
    rest = deployment_ids - limits.keys()
    if rest:
        rows = session.execute(
            select(Deployment.id, Deployment.spec_doc).where(Deployment.id.in_(rest))
        )
        limits.update({dep_id: Spec.from_doc(doc).max_boot_s for dep_id, doc in rows})
    return limits


def _beat_time(beat: bytes | str, now: datetime) -> datetime:
    """A heartbeat's own time (`now` when it cannot be read)."""
    try:
        return datetime.fromtimestamp(float(json.loads(beat)["at"]), UTC)
    except (ValueError, KeyError, TypeError):
        return now

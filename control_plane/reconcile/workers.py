"""Reconcilers of workers: reap exited processes, fail workers that went silent or overran
their boot (both return the ids of the workers that died this tick, whose running jobs
`orphans.requeue` then hands back to the queue), and make busy workers whose jobs all ended
idle."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from common.protocol import HEARTBEAT_TTL_S, WorkerState, worker_heartbeat_key
from control_plane.db.models import Deployment, Worker
from control_plane.domain.fleet import liveness
from control_plane.domain.spec import Spec
from control_plane.reconcile import tick_trace
from control_plane.reconcile.env import Env
from control_plane.services import deployments
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)
# A worker without a heartbeat for HEARTBEAT_TTL_S is lost, once it had time to send one.
HEARTBEAT_GRACE_S = 2 * HEARTBEAT_TTL_S
# A warm-pool worker (no deployment, so no spec's max_boot_s) that has not booted by then is lost.
POOL_MAX_BOOT_S = 600.0


def reap(session: Session, env: Env, now: datetime) -> list[str]:
    """Workers whose process ended: stopped (exit 0) or failed (any other status)."""
    dead = []
    for exited in env.provider.reap():
        dead.append(exited.worker_id)
        if session.get(Worker, exited.worker_id) is None:
            continue
        tick_trace.note(
            "worker.exited",
            **{
                "platform.worker.id": exited.worker_id,
                "platform.worker.exit_code": exited.returncode,
            },
        )
        if exited.returncode == 0:
            state, reason = WorkerState.STOPPED, None
        else:
            state, reason = WorkerState.FAILED, f"exit_{exited.returncode}"
            log.warning(
                "worker %s exited with %d",
                exited.worker_id,
                exited.returncode,
                extra={"worker_id": exited.worker_id, "reason": reason},
            )
        worker_records.transition(session, env.settings, exited.worker_id, state, now, now, reason)
    session.commit()
    return dead


def check_liveness(session: Session, env: Env, now: datetime) -> list[str]:
    """Record heartbeats; kill and fail the workers `fleet.liveness` says are lost."""
    live = worker_records.live(session)
    beats = env.redis.mget([worker_heartbeat_key(w.id) for w in live]) if live else []
    max_boot_s = _max_boot_s(session, {w.deployment_id for w in live if w.deployment_id})
    lost = []
    for w, beat in zip(live, beats, strict=True):
        if beat is not None:
            w.last_heartbeat_at = _heartbeat_time(beat, w.last_heartbeat_at, now)
        verdict = liveness(
            WorkerState(w.state),
            w.started_at,
            w.state_since,
            w.last_heartbeat_at,
            beat is not None,
            max_boot_s.get(w.deployment_id or "", POOL_MAX_BOOT_S),
            HEARTBEAT_GRACE_S,
            now,
        )
        if verdict.reason is None:
            continue
        log.warning(
            "worker %s failed: %s",
            w.id,
            verdict.reason,
            extra={"worker_id": w.id, "deployment_id": w.deployment_id, "reason": verdict.reason},
        )
        env.provider.kill(w.id)
        tick_trace.note(
            "worker.lost", **{"platform.worker.id": w.id, "platform.worker.reason": verdict.reason}
        )
        worker_records.transition(
            session,
            env.settings,
            w.id,
            WorkerState.FAILED,
            verdict.ended_at,
            now,
            reason=verdict.reason,
            note="heartbeat" if verdict.reason == "heartbeat_lost" else None,
        )
        lost.append(w.id)
    session.commit()
    return lost


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


def _heartbeat_time(beat: bytes | str, previous: datetime | None, now: datetime) -> datetime:
    """The heartbeat's own time, never earlier than the last one seen nor later than now."""
    try:
        seen = datetime.fromtimestamp(float(json.loads(beat)["at"]), UTC)
    except (ValueError, KeyError, TypeError):
        return now
    return min(max(seen, previous or seen), now)

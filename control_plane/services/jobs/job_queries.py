"""Read-side job queries: load per deployment for the scaler, jobs each reconciler must end or
requeue, queue positions and recent execution times for ETAs, a tenant's in-flight count.

Nothing here writes; the reconcilers act on what these return (`control_plane/reconcile/`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.orm import Session

from common.protocol import PRIORITY_OF_KIND
from control_plane.db.models import Deployment, Job, Worker
from control_plane.domain.scaling.service import MAX_SAMPLES, MIN_SAMPLES, SERVICE_WINDOW_S
from control_plane.domain.states import ACTIVE, PENDING, JobStatus
from control_plane.services.workers.worker_records import ENDED_STATES

_PENDING = [s.value for s in PENDING]
_ACTIVE = [s.value for s in ACTIVE]


def load_by_deployment(session: Session) -> dict[str, tuple[int, int, datetime | None]]:
    """deployment id → (pending jobs, running jobs, newest activity among active jobs)."""
    rows = session.execute(
        select(Job.deployment_id, Job.status, func.count(), func.max(Job.created_at))
        .where(
            Job.status.in_(_ACTIVE),
            # A batch's undispatched jobs are not demand yet: max_in_flight bounds them.
            Job.dispatched_at.is_not(None) | (Job.status == JobStatus.RUNNING),
        )
        .group_by(Job.deployment_id, Job.status)
    ).all()
    out: dict[str, tuple[int, int, datetime | None]] = {}
    for dep_id, status, count, newest in rows:
        pending, running, _ = out.get(dep_id, (0, 0, None))
        if status == JobStatus.RUNNING:
            running += count
        else:
            pending += count
        out[dep_id] = (pending, running, newest)
    return out


def last_completed_at(session: Session, deployment_id: str) -> datetime | None:
    value: datetime | None = session.scalar(
        select(func.max(Job.completed_at)).where(Job.deployment_id == deployment_id)
    )
    return value


def pending_ids(session: Session, deployment_id: str) -> list[str]:
    """Jobs of a deployment waiting for a worker (queued or starting)."""
    return list(
        session.scalars(
            select(Job.id).where(Job.deployment_id == deployment_id, Job.status.in_(_PENDING))
        )
    )


def overdue_ids(session: Session, now: datetime) -> list[str]:
    """Pending jobs whose ttl passed before a worker claimed them."""
    rows = session.execute(
        select(Job.id, Job.created_at, Job.ttl_s).where(
            Job.status.in_(_PENDING), Job.ttl_s.is_not(None)
        )
    ).all()
    return [
        job_id
        for job_id, created_at, ttl_s in rows
        if now > created_at + timedelta(seconds=float(ttl_s or 0))
    ]


def overrunning(session: Session, grace_s: float, now: datetime) -> list[tuple[str, float]]:
    """(job id, its limit) of running jobs past their execution limit + `grace_s`.

    A job's limit is its own `execution_timeout_s`, else its deployment's.
    """
    rows = session.execute(
        select(Job.id, Job.started_at, Job.execution_timeout_s, Job.deployment_id).where(
            Job.status == JobStatus.RUNNING
        )
    ).all()
    if not rows:
        return []
    # One spec per deployment, not per running job: this runs every reconciler tick.
    dep_ids = {dep_id for *_, dep_id in rows}
    specs = {
        d.id: d.spec for d in session.scalars(select(Deployment).where(Deployment.id.in_(dep_ids)))
    }
    out = []
    for job_id, started_at, own_limit_s, dep_id in rows:
        spec = specs.get(dep_id)
        if spec is None or started_at is None:
            continue
        limit_s = spec.execution_limit_s(own_limit_s)
        if now > started_at + timedelta(seconds=limit_s + grace_s):
            out.append((job_id, limit_s))
    return out


def running_on(session: Session, worker_ids: list[str]) -> list[Job]:
    """Running jobs held by these workers."""
    if not worker_ids:
        return []
    return list(
        session.scalars(
            select(Job).where(Job.worker_id.in_(worker_ids), Job.status == JobStatus.RUNNING)
        )
    )


def running_on_ended(session: Session, ended_before: datetime) -> list[tuple[str, int, datetime]]:
    """(job id, attempt, when its worker ended) of the running jobs whose worker stopped or
    failed before `ended_before`: jobs nothing will report any more."""
    rows = session.execute(_RUNNING_ON_ENDED, {"b_before": ended_before}).all()
    return [(job_id, attempt, stopped_at or since) for job_id, attempt, stopped_at, since in rows]


# Driven by the running jobs (the partial index of running jobs: `status = 'running'` as a
# literal), not by the ended workers, whose rows pile up for as long as the history is kept.
_RUNNING_ON_ENDED = (
    select(Job.id, Job.attempt, Worker.stopped_at, Worker.state_since)
    .join(Worker, Worker.id == Job.worker_id)
    .where(
        text("jobs.status = 'running'"),
        Worker.state.in_(sorted(s.value for s in ENDED_STATES)),
        Worker.state_since < bindparam("b_before"),
    )
)


def queue_position(session: Session, job: Job) -> int | None:
    """Jobs ahead of this one for its deployment (higher priority class, or same and older)."""
    if job.status not in PENDING:
        return None
    mine = PRIORITY_OF_KIND.get(job.kind, PRIORITY_OF_KIND["async"])
    ahead_kinds = [k for k, p in PRIORITY_OF_KIND.items() if p < mine]
    same_deployment = Job.deployment_id == job.deployment_id
    higher = session.scalar(
        select(func.count()).where(
            same_deployment, Job.status.in_(_PENDING), Job.kind.in_(ahead_kinds)
        )
    )
    older = session.scalar(
        select(func.count()).where(
            same_deployment, Job.status.in_(_PENDING), Job.kind == job.kind, Job.id < job.id
        )
    )
    return int(higher or 0) + int(older or 0)


def recent_execution_s(session: Session, deployment_id: str, limit: int = 20) -> float | None:
    """Mean execution time of the deployment's latest finished jobs (None: no history)."""
    spans = [seconds for _, seconds in _executions(session, deployment_id, limit)]
    return sum(spans) / len(spans) if spans else None


def recent_executions(
    session: Session, deployment_id: str, now: datetime
) -> list[tuple[float, float]]:
    """(completed at, execution seconds) of the deployment's latest finished jobs, newest first:
    those that ended within `scaling.service.SERVICE_WINDOW_S` of `now`, and at least the last
    `MIN_SAMPLES`, at most `MAX_SAMPLES` (what `scaling.service.mean_service_s` reads). Both
    reads walk `ix_jobs_deployment_completed` back from the newest end."""
    since = now - timedelta(seconds=SERVICE_WINDOW_S)
    rows = _executions(session, deployment_id, MAX_SAMPLES, since)
    if len(rows) < MIN_SAMPLES:
        rows = _executions(session, deployment_id, MIN_SAMPLES)
    return rows


def _executions(
    session: Session, deployment_id: str, limit: int, since: datetime | None = None
) -> list[tuple[float, float]]:
    """(completed at, execution seconds) of the latest `limit` succeeded jobs, newest first;
    only those that ended at `since` or later when it is given."""
    where = [
        Job.deployment_id == deployment_id,
        Job.status == JobStatus.SUCCEEDED,
        Job.started_at.is_not(None),
    ]
    if since is not None:
        where.append(Job.completed_at >= since)
    query = (
        select(Job.started_at, Job.completed_at)
        .where(*where)
        .order_by(Job.completed_at.desc())
        .limit(limit)
    )
    return [
        (c.timestamp(), (c - s).total_seconds())
        for s, c in session.execute(query).all()
        if s is not None and c is not None
    ]


def states_sql(states: Iterable[str]) -> str:
    """The list of an SQL `status IN (...)` for these job statuses: `'queued', 'running'`.
    Literals, not bound parameters: an expanding IN cost more than the hot-path statements it
    is in (the claim, a job's end, the quota count). Only JobStatus values get through."""
    return ", ".join(f"'{JobStatus(s).value}'" for s in sorted(states))


# A quota check runs this on every admission. As text, not a select(): executed through the
# ORM, the select's expanding IN and cache key cost ~4x the query itself (134 against 34 us
# alone; 0.65 ms in a busy API process). The statuses are the domain's constants; the same
# shape as the index ix_jobs_tenant_status serves.
_ACTIVE_OF_TENANT = text(
    "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE tenant_id = :tenant_id"
    f" AND status IN ({states_sql(_ACTIVE)})"
    f" AND (dispatched_at IS NOT NULL OR status = '{JobStatus.RUNNING.value}')"
    " LIMIT :upto) AS active"
)


def active_count(session: Session, tenant_id: str, upto: int) -> int:
    """Jobs of a tenant that are queued, starting or running, counted no further than `upto`
    (a quota check only asks whether the tenant is at its limit)."""
    params = {"tenant_id": tenant_id, "upto": upto}
    return int(session.scalar(_ACTIVE_OF_TENANT, params) or 0)

"""Jobs: create (committed before acknowledged), read, cancel, and the fenced worker reports.

Fencing: a claim bumps `attempt`; `complete` only applies when the report carries the current
attempt and the job is still running, so a stale attempt can never overwrite a newer one and a
terminal state is final.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from control_plane.db.models import Deployment, Job, JobAttempt, Worker
from control_plane.domain.ids import new_id
from control_plane.domain.states import ACTIVE, PENDING, TERMINAL, JobStatus
from control_plane.errors import Conflict, NotFound
from control_plane.services.paging import tenant_page


def create(
    session: Session,
    deployment: Deployment,
    job_input: dict[str, Any],
    kind: str,
    now: datetime,
    *,
    webhook_url: str | None = None,
    webhook_events: list[str] | None = None,
    ttl_s: float | None = None,
    execution_timeout_s: float | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    api_key_id: str | None = None,
    dispatch: bool = True,
) -> tuple[Job, bool]:
    """Insert a queued job; returns (job, created). Same idempotency key + body → same job."""
    if idempotency_key is not None:
        existing = _by_idempotency_key(session, deployment.tenant_id, idempotency_key)
        if existing is not None:
            return _check_replay(existing, request_hash), False
    job = Job(
        id=new_id("job", now),
        tenant_id=deployment.tenant_id,
        deployment_id=deployment.id,
        deployment_name=deployment.name,
        deployment_version=deployment.version,
        kind=kind,
        status=JobStatus.QUEUED,
        input=job_input,
        webhook_url=webhook_url,
        webhook_events=webhook_events,
        webhook_status="pending" if webhook_url else "none",
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        ttl_s=ttl_s,
        execution_timeout_s=execution_timeout_s,
        api_key_id=api_key_id,
        # The caller sends the wake-up right after the commit (batch jobs wait for a slot).
        dispatched_at=now if dispatch else None,
        created_at=now,
    )
    session.add(job)
    try:
        session.flush()
    except IntegrityError:
        # A concurrent request with the same key won the race.
        session.rollback()
        existing = _by_idempotency_key(session, deployment.tenant_id, idempotency_key or "")
        if existing is None:
            raise
        return _check_replay(existing, request_hash), False
    return job, True


def _by_idempotency_key(session: Session, tenant_id: str, key: str) -> Job | None:
    return session.scalars(
        select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key)
    ).first()


def _check_replay(existing: Job, request_hash: str | None) -> Job:
    if existing.request_hash != request_hash:
        raise Conflict(
            "this Idempotency-Key was used with a different request body",
            job_id=existing.id,
        )
    return existing


def get(session: Session, tenant_id: str, job_id: str) -> Job:
    job = session.get(Job, job_id)
    # Another tenant's job is indistinguishable from a missing one.
    if job is None or job.tenant_id != tenant_id:
        raise NotFound(f"job '{job_id}' does not exist", job_id=job_id)
    return job


def list_(
    session: Session,
    tenant_id: str,
    *,
    deployment: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Job], str | None]:
    """Newest first; the cursor is the last id of the previous page (ids sort by time)."""
    return tenant_page(
        session, Job, tenant_id, deployment=deployment, status=status, limit=limit, cursor=cursor
    )


def cancel(session: Session, tenant_id: str, job_id: str, now: datetime) -> tuple[Job, bool]:
    """Cancel unless already terminal; returns (job, changed)."""
    job = get(session, tenant_id, job_id)
    was_running = job.status == JobStatus.RUNNING
    res = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_([s.value for s in ACTIVE]))
        .values(status=JobStatus.CANCELED, completed_at=now, status_reason="canceled_by_user")
    )
    changed = res.rowcount > 0  # type: ignore[attr-defined]
    session.refresh(job)
    if changed and was_running:
        # The user's cancel: the time it ran is billed (its worker held it until now).
        end_attempt(session, job.id, job.attempt, "canceled", now)
    return job, changed


def claim(session: Session, job_id: str, worker_id: str, now: datetime) -> Job | None:
    """Give a pending job to a worker as a new attempt; None if it is not claimable."""
    job = session.get(Job, job_id)
    if job is None or job.status not in PENDING:
        return None
    if job.ttl_s is not None and now > job.created_at + timedelta(seconds=float(job.ttl_s)):
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_([s.value for s in PENDING]))
            .values(status=JobStatus.EXPIRED, completed_at=now, status_reason="ttl_passed")
        )
        return None
    waited_on_boot = job.status == JobStatus.STARTING
    res = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_([s.value for s in PENDING]))
        .values(
            status=JobStatus.RUNNING,
            attempt=Job.attempt + 1,
            worker_id=worker_id,
            started_at=func.coalesce(Job.started_at, now),
            status_reason=None,
        )
    )
    if res.rowcount == 0:  # type: ignore[attr-defined]
        return None
    session.refresh(job)
    session.add(
        JobAttempt(
            job_id=job.id,
            attempt=job.attempt,
            worker_id=worker_id,
            started_at=now,
            boot_wait=waited_on_boot,
        )
    )
    return job


def complete(
    session: Session,
    job_id: str,
    attempt: int,
    status: JobStatus,
    now: datetime,
    *,
    output: dict[str, Any] | None,
    error: dict[str, Any] | None,
    prompt_tokens: int | None,
    generated_tokens: int | None,
) -> Job:
    """Apply a worker's final report if it belongs to the current attempt."""
    if status not in TERMINAL:
        raise ValueError(f"{status} is not a terminal status")
    res = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.status == JobStatus.RUNNING)
        .values(
            status=status,
            output=output,
            error=error,
            prompt_tokens=prompt_tokens,
            generated_tokens=generated_tokens,
            completed_at=now,
        )
    )
    if res.rowcount == 0:  # type: ignore[attr-defined]
        raise Conflict(f"attempt {attempt} of job '{job_id}' is no longer current", job_id=job_id)
    job = session.get(Job, job_id)
    assert job is not None
    session.refresh(job)
    cached = (output or {}).get("cached_tokens")
    end_attempt(
        session,
        job_id,
        attempt,
        status.value,
        now,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        cached_tokens=cached if isinstance(cached, int) else None,
    )
    return job


def end_attempt(
    session: Session,
    job_id: str,
    attempt: int,
    outcome: str,
    at: datetime,
    *,
    prompt_tokens: int | None = None,
    generated_tokens: int | None = None,
    cached_tokens: int | None = None,
) -> None:
    """Close an attempt (first close wins: a later report cannot rewrite it)."""
    row = session.scalars(
        select(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
    ).first()
    if row is None or row.ended_at is not None:
        return
    row.ended_at = max(at, row.started_at)
    row.outcome = outcome
    row.prompt_tokens = prompt_tokens
    row.generated_tokens = generated_tokens
    row.cached_tokens = cached_tokens


def mark_starting(session: Session, deployment_id: str, reason: str) -> list[str]:
    """Queued jobs of a deployment now wait on a booting worker; returns their ids."""
    ids = list(
        session.scalars(
            select(Job.id).where(
                Job.deployment_id == deployment_id,
                Job.status == JobStatus.QUEUED,
                Job.dispatched_at.is_not(None),
            )
        )
    )
    if ids:
        session.execute(
            update(Job)
            .where(Job.id.in_(ids), Job.status == JobStatus.QUEUED)
            .values(status=JobStatus.STARTING, status_reason=reason)
        )
    return ids


def load_by_deployment(session: Session) -> dict[str, tuple[int, int, datetime | None]]:
    """deployment id → (pending jobs, running jobs, newest activity among active jobs)."""
    rows = session.execute(
        select(Job.deployment_id, Job.status, func.count(), func.max(Job.created_at))
        .where(
            Job.status.in_([s.value for s in ACTIVE]),
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


def usage_of(job: Job) -> dict[str, Any]:
    queue_s = exec_s = None
    if job.started_at is not None:
        queue_s = round((job.started_at - job.created_at).total_seconds(), 3)
        if job.completed_at is not None:
            exec_s = round((job.completed_at - job.started_at).total_seconds(), 3)
    return {
        "prompt_tokens": job.prompt_tokens,
        "generated_tokens": job.generated_tokens,
        "queue_s": queue_s,
        "execution_s": exec_s,
    }


def to_public(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "deployment": job.deployment_name,
        "deployment_version": job.deployment_version,
        "kind": job.kind,
        "status": job.status,
        "status_reason": job.status_reason,
        "input": job.input,
        "output": job.output,
        "error": job.error,
        "usage": usage_of(job),
        "attempt": job.attempt,
        "webhook": job.webhook_url,
        "webhook_status": job.webhook_status,
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "completed_at": _iso(job.completed_at),
    }


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat().replace("+00:00", "Z")


def fail_pending(
    session: Session, deployment_id: str, error: dict[str, Any], now: datetime
) -> list[Job]:
    """Fail every waiting job of a deployment (its workers cannot start)."""
    rows = list(
        session.scalars(
            select(Job).where(
                Job.deployment_id == deployment_id, Job.status.in_([s.value for s in PENDING])
            )
        )
    )
    for job in rows:
        job.status = JobStatus.FAILED
        job.error = error
        job.completed_at = now
    return rows


# A job whose worker died is retried this many times in all before it fails.
MAX_ATTEMPTS = 3


def requeue_orphans(session: Session, dead_worker_ids: list[str], now: datetime) -> list[Job]:
    """Running jobs of dead workers go back to the queue (or fail after MAX_ATTEMPTS).

    Returns the requeued jobs. The attempt number stays as the fence: a report from the dead
    attempt can no longer apply once a new claim bumped it.
    """
    if not dead_worker_ids:
        return []
    rows = list(
        session.scalars(
            select(Job).where(Job.worker_id.in_(dead_worker_ids), Job.status == JobStatus.RUNNING)
        )
    )
    requeued = []
    for job in rows:
        # The platform lost this attempt: it ends where its worker's life ended, unbilled.
        end_attempt(session, job.id, job.attempt, "worker_lost", _worker_end(session, job, now))
        if job.attempt >= MAX_ATTEMPTS:
            job.status = JobStatus.FAILED
            job.error = {
                "type": "worker_lost",
                "message": f"the worker running this job stopped {job.attempt} times",
            }
            job.completed_at = now
        else:
            job.status = JobStatus.QUEUED
            job.status_reason = "worker_lost"
            job.worker_id = None
            requeued.append(job)
    return requeued


def expire_overdue(session: Session, now: datetime) -> list[Job]:
    """Pending jobs whose ttl passed before they started become `expired`."""
    rows = list(
        session.scalars(
            select(Job).where(Job.status.in_([s.value for s in PENDING]), Job.ttl_s.is_not(None))
        )
    )
    expired = []
    for job in rows:
        if now > job.created_at + timedelta(seconds=float(job.ttl_s or 0)):
            job.status = JobStatus.EXPIRED
            job.status_reason = "ttl_passed"
            job.completed_at = now
            expired.append(job)
    return expired


def time_out_overrun(
    session: Session, default_limit_s: dict[str, float], grace_s: float, now: datetime
) -> list[Job]:
    """Running jobs past their execution limit (+ grace): the worker missed it; end them here.

    `default_limit_s` maps deployment id → its execution_timeout_s.
    """
    rows = list(session.scalars(select(Job).where(Job.status == JobStatus.RUNNING)))
    out = []
    for job in rows:
        limit = job.execution_timeout_s or default_limit_s.get(job.deployment_id, 600.0)
        if job.started_at is not None and now > job.started_at + timedelta(
            seconds=float(limit) + grace_s
        ):
            job.status = JobStatus.TIMED_OUT
            job.status_reason = "execution_timeout"
            job.error = {
                "type": "timed_out",
                "message": f"the job ran longer than its execution limit of {float(limit):g} s",
            }
            job.completed_at = now
            end_attempt(session, job.id, job.attempt, "timed_out", now)
            out.append(job)
    return out


def queue_position(session: Session, job: Job) -> int | None:
    """Jobs ahead of this one for its deployment (higher priority class, or same and older)."""
    if job.status not in PENDING:
        return None
    rank = {"sync": 0, "async": 1, "batch": 2}
    ahead_kinds = [k for k, r in rank.items() if r < rank.get(job.kind, 1)]
    pending = [s.value for s in PENDING]
    same_deployment = Job.deployment_id == job.deployment_id
    higher = session.scalar(
        select(func.count()).where(
            same_deployment, Job.status.in_(pending), Job.kind.in_(ahead_kinds)
        )
    )
    older = session.scalar(
        select(func.count()).where(
            same_deployment, Job.status.in_(pending), Job.kind == job.kind, Job.id < job.id
        )
    )
    return int(higher or 0) + int(older or 0)


def recent_execution_s(session: Session, deployment_id: str, limit: int = 20) -> float | None:
    """Mean execution time of the deployment's latest finished jobs (None: no history)."""
    rows = session.execute(
        select(Job.started_at, Job.completed_at)
        .where(
            Job.deployment_id == deployment_id,
            Job.status == JobStatus.SUCCEEDED,
            Job.started_at.is_not(None),
        )
        .order_by(Job.completed_at.desc())
        .limit(limit)
    ).all()
    spans = [(c - s).total_seconds() for s, c in rows if s is not None and c is not None]
    return sum(spans) / len(spans) if spans else None


def exists_for_key(session: Session, tenant_id: str, idempotency_key: str) -> bool:
    return _by_idempotency_key(session, tenant_id, idempotency_key) is not None


def active_count(session: Session, tenant_id: str) -> int:
    """Jobs of a tenant that are queued, starting or running."""
    n = session.scalar(
        select(func.count()).where(
            Job.tenant_id == tenant_id,
            Job.status.in_([s.value for s in ACTIVE]),
            Job.dispatched_at.is_not(None) | (Job.status == JobStatus.RUNNING),
        )
    )
    return int(n or 0)


def _worker_end(session: Session, job: Job, now: datetime) -> datetime:
    w = session.get(Worker, job.worker_id) if job.worker_id else None
    return (w.stopped_at if w is not None and w.stopped_at else None) or now

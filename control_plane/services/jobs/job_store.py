"""Jobs: create (committed before acknowledged), read, list, the public shape, and the
`starting` state of jobs that wait on a booting worker.

A claim (pending → running, a new attempt) is `claims.py`; the end of a job is `finish.py`, the
one place a job ends. Read-side queries for the reconcilers and ETAs are in `job_queries.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common import tracing
from common.job_input import JobInput
from control_plane.db.models import Job
from control_plane.domain.clock import iso
from control_plane.domain.ids import new_id
from control_plane.domain.states import JobStatus
from control_plane.errors import Conflict, NotFound
from control_plane.services.paging import tenant_page
from control_plane.services.tenants.edge_cache import DeploymentRef


def create(
    session: Session,
    deployment: DeploymentRef,
    job_input: JobInput,
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
    replay: Job | None = None,
) -> tuple[Job, bool]:
    """Insert a queued job; returns (job, created). Same idempotency key + body → same job:
    `replay` is the job the caller found for `idempotency_key` (`replay_of`), looked up once
    per call, before its quota was charged."""
    if replay is not None:
        return _check_replay(replay, request_hash), False
    values: dict[str, Any] = dict(
        id=new_id("job", now),
        tenant_id=deployment.tenant_id,
        deployment_id=deployment.id,
        deployment_name=deployment.name,
        deployment_version=deployment.version,
        kind=kind,
        status=JobStatus.QUEUED.value,
        input=job_input.to_dict(),
        attempt=0,
        webhook_url=webhook_url,
        webhook_events=webhook_events,
        webhook_status="pending" if webhook_url else "none",
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        ttl_s=ttl_s,
        execution_timeout_s=execution_timeout_s,
        api_key_id=api_key_id,
        # the span current here (the admission's): the worker's spans join its trace; in the
        # same INSERT, so tracing costs no round trip (None when off)
        traceparent=tracing.current_traceparent(),
        # The caller sends the wake-up right after the commit (batch jobs wait for a slot).
        dispatched_at=now if dispatch else None,
        created_at=now,
    )
    try:
        # A Core insert: the ORM's unit of work cost more than the statement (hot path).
        session.execute(_INSERT_JOB, values)
    except IntegrityError:
        # A concurrent request with the same key won the race.
        session.rollback()
        existing = replay_of(session, deployment.tenant_id, idempotency_key or "")
        if existing is None:
            raise
        return _check_replay(existing, request_hash), False
    # Not attached to the session: the row is written; this object only carries its values.
    return Job(**values), True


_INSERT_JOB = insert(Job.metadata.tables["jobs"])


def replay_of(session: Session, tenant_id: str, key: str) -> Job | None:
    """The tenant's job created with idempotency `key`, or None (the answer nearly every call
    gets: the SDK sends a new key with each). Its id first, by a statement built once: built
    per call through the ORM, and made twice per call, this lookup cost a keyed call ~1.2 ms
    of latency on the warm path (`bench/ab_warm_path.py --idempotency-keys`)."""
    job_id = session.execute(_ID_OF_KEY, {"b_tenant": tenant_id, "b_key": key}).scalar()
    return None if job_id is None else session.get(Job, job_id)


_ID_OF_KEY = select(Job.metadata.tables["jobs"].c.id).where(
    Job.metadata.tables["jobs"].c.tenant_id == bindparam("b_tenant"),
    Job.metadata.tables["jobs"].c.idempotency_key == bindparam("b_key"),
)


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


@dataclass(frozen=True, slots=True)
class Waiting:
    id: str
    attempt: int  # attempts so far (a requeued job waits again)
    wants_starting: bool  # it has a webhook asking for `starting` events


def mark_starting(session: Session, deployment_id: str, reason: str) -> list[Waiting]:
    """The jobs of a deployment wait on a worker that boots (or may not boot yet): queued ones
    (sent to its queue) become `starting`, and every waiting job's status_reason becomes
    `reason` (it follows a cold start's phase). Returns the jobs that wait."""
    mark_starting_many(session, {deployment_id: reason})
    return waiting_jobs(session, [deployment_id]).get(deployment_id, [])


def mark_starting_many(session: Session, reasons: dict[str, str]) -> None:
    """`mark_starting` for many deployments (deployment id → reason), without reading the
    jobs: one conditional update per distinct reason, which touches only the rows that change
    (a tick with a thousand cold starts must not cost a thousand round trips)."""
    by_reason: dict[str, list[str]] = {}
    for deployment_id, reason in reasons.items():
        by_reason.setdefault(reason, []).append(deployment_id)
    for reason, ids in by_reason.items():
        for i in range(0, len(ids), _IN_CHUNK):
            session.execute(
                update(Job)
                .where(
                    Job.deployment_id.in_(ids[i : i + _IN_CHUNK]),
                    # queued ones sent to a queue, and starting ones told another reason; the
                    # status guard keeps a job claimed meanwhile running
                    ((Job.status == JobStatus.QUEUED) & Job.dispatched_at.is_not(None))
                    | (
                        (Job.status == JobStatus.STARTING)
                        & (Job.status_reason.is_(None) | (Job.status_reason != reason))
                    ),
                )
                .values(status=JobStatus.STARTING, status_reason=reason)
            )


def waiting_jobs(session: Session, deployment_ids: list[str]) -> dict[str, list[Waiting]]:
    """The jobs that wait on a worker (starting, or queued and sent), per deployment (only
    those that have some)."""
    out: dict[str, list[Waiting]] = {}
    for i in range(0, len(deployment_ids), _IN_CHUNK):
        rows = session.execute(
            select(Job.id, Job.deployment_id, Job.attempt, Job.webhook_url, Job.webhook_events)
            .where(
                Job.deployment_id.in_(deployment_ids[i : i + _IN_CHUNK]),
                (Job.status == JobStatus.STARTING)
                | ((Job.status == JobStatus.QUEUED) & Job.dispatched_at.is_not(None)),
            )
            .order_by(Job.id)
        )
        for row in rows:
            wants = bool(row.webhook_url) and "starting" in (row.webhook_events or [])
            out.setdefault(row.deployment_id, []).append(Waiting(row.id, row.attempt, wants))
    return out


_IN_CHUNK = 5000  # ids per IN (...) list: well under SQLite's and PostgreSQL's bind limits


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
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "completed_at": iso(job.completed_at),
    }


def ttl_passed(job: Job, now: datetime) -> bool:
    """A pending job whose ttl ran out before a worker claimed it (it must expire, not run)."""
    return job.ttl_s is not None and now > job.created_at + timedelta(seconds=float(job.ttl_s))

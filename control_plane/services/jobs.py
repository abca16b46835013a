"""Jobs: create (committed before acknowledged), read, claim, and attempts.

Fencing: a claim bumps `attempt`; a worker's final report applies only for the current attempt
while the job runs (`services/finish.py`, the one place a job ends), so a stale attempt can never
overwrite a newer one and a terminal state is final. Read-side queries for the reconcilers and
ETAs are in `job_queries.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, case, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from control_plane.db.models import Job, JobAttempt
from control_plane.domain.clock import iso
from control_plane.domain.ids import new_id
from control_plane.domain.states import PENDING, JobStatus
from control_plane.errors import Conflict, NotFound
from control_plane.services.edge_cache import DeploymentRef
from control_plane.services.job_queries import states_sql
from control_plane.services.paging import tenant_page
from worker import tracing


def create(
    session: Session,
    deployment: DeploymentRef,
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
        input=job_input,
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


def claim_queued(session: Session, job_id: str, worker_id: str, now: datetime) -> Job | None:
    """`claim` of the job a warm path claims (queued, no ttl to check) in one UPDATE that
    returns its row, instead of an ORM read and then the UPDATE; None when the job is anything
    else (starting, running, ended, with a ttl, unknown): `claim` judges those. The job is not
    attached to the session: for a session of its own (the claim's request)."""
    row = session.execute(
        _CLAIM_QUEUED, {"b_id": job_id, "b_worker_id": worker_id, "b_now": now}
    ).first()
    if row is None:
        return None
    job = Job(**row._mapping)
    _record_attempt(session, job, worker_id, now, boot_wait=False)  # queued: nothing booted
    return job


def claim(session: Session, job_id: str, worker_id: str, now: datetime) -> Job | None:
    """Give a pending job to a worker as a new attempt; None if it is not claimable.

    The worker that holds a running job gets the same attempt again: its claim was retried
    because the answer was lost (the API died after the commit), and a refusal would leave
    the job `running` on a worker that never ran it. NOTE: a worker never runs an attempt it
    already holds twice (`worker/runtime/jobs.py`), so a redelivered message is safe.
    """
    job = session.get(Job, job_id)
    if job is not None and job.status == JobStatus.RUNNING and job.worker_id == worker_id:
        return job
    if job is None or job.status not in PENDING or ttl_passed(job, now):
        return None
    waited_on_boot = job.status == JobStatus.STARTING
    values = {
        "status": JobStatus.RUNNING.value,
        "attempt": job.attempt + 1,
        "worker_id": worker_id,
        "started_at": job.started_at or now,
        "status_reason": None,
    }
    # `attempt` as read: the values above are then exactly what the row gets
    params = {f"b_{key}": value for key, value in values.items()}
    res = session.execute(_CLAIM, {**params, "b_id": job_id, "b_read_attempt": job.attempt})
    if res.rowcount == 0:  # type: ignore[attr-defined]
        return None
    for key, value in values.items():  # instead of reading the row back
        set_committed_value(job, key, value)
    _record_attempt(session, job, worker_id, now, boot_wait=waited_on_boot)
    return job


def _record_attempt(
    session: Session, job: Job, worker_id: str, now: datetime, *, boot_wait: bool
) -> None:
    """The attempt a claim just started (billing allocates from it; `end_attempt` closes it)."""
    params = {"job_id": job.id, "attempt": job.attempt, "worker_id": worker_id}
    session.execute(_INSERT_ATTEMPT, {**params, "started_at": now, "boot_wait": boot_wait})


# A claim's statements, built once (Core, on the tables): built per call through the ORM, the
# UPDATE's construction, cache key and expanding IN, and the unit of work of the attempt's
# INSERT, cost more than the statements themselves on every job's path.
_jobs = Job.metadata.tables["jobs"]
_CLAIM = (
    update(_jobs)
    .where(
        _jobs.c.id == bindparam("b_id"),
        text(f"status IN ({states_sql(PENDING)})"),
        _jobs.c.attempt == bindparam("b_read_attempt"),
    )
    .values(
        {
            c: bindparam(f"b_{c}")
            for c in ("status", "attempt", "worker_id", "started_at", "status_reason")
        }
    )
)
_INSERT_ATTEMPT = insert(JobAttempt.metadata.tables["job_attempts"])
# The claim of a queued job without a ttl (`claim_queued`): one UPDATE returning the row.
_CLAIM_QUEUED = (
    update(_jobs)
    .where(
        _jobs.c.id == bindparam("b_id"),
        _jobs.c.status == JobStatus.QUEUED.value,
        _jobs.c.ttl_s.is_(None),
    )
    .values(
        status=JobStatus.RUNNING.value,
        attempt=_jobs.c.attempt + 1,
        worker_id=bindparam("b_worker_id"),
        # a retried job keeps the start of its first attempt
        started_at=func.coalesce(
            _jobs.c.started_at, bindparam("b_now", type_=_jobs.c.started_at.type)
        ),
        status_reason=None,
    )
    .returning(*_jobs.c)
)

# Closing an attempt (`end_attempt`), built once: a Core UPDATE of the table, RETURNING the
# attempt's id. Through the ORM (an UPDATE of the class, synchronized by "fetch") the same
# statement cost ~0.4 ms of CPU on every job's end, more than the rest of its transaction.
_attempts = JobAttempt.metadata.tables["job_attempts"]
_at = bindparam("b_at", type_=_attempts.c.started_at.type)
_END_ATTEMPT = (
    update(_attempts)
    .where(
        _attempts.c.job_id == bindparam("b_job_id"),
        _attempts.c.attempt == bindparam("b_attempt"),
        _attempts.c.ended_at.is_(None),
    )
    .values(
        # never before it started (a clock behind the claim's)
        ended_at=case((_attempts.c.started_at > _at, _attempts.c.started_at), else_=_at),
        outcome=bindparam("b_outcome"),
        prompt_tokens=bindparam("b_prompt_tokens"),
        generated_tokens=bindparam("b_generated_tokens"),
        cached_tokens=bindparam("b_cached_tokens"),
    )
    .returning(_attempts.c.id)
)


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
    """Close an attempt (first close wins: a later report cannot rewrite it), never before it
    started. One UPDATE: on every job's path, where reading the row first cost a statement."""
    closed = session.execute(
        _END_ATTEMPT,
        {
            "b_job_id": job_id,
            "b_attempt": attempt,
            "b_at": at,
            "b_outcome": outcome,
            "b_prompt_tokens": prompt_tokens,
            "b_generated_tokens": generated_tokens,
            "b_cached_tokens": cached_tokens,
        },
    ).scalar()
    # An attempt this session holds (the reconciler's billing reads them later in its tick)
    # reloads as written.
    held = session.identity_map.get(identity_key(JobAttempt, closed)) if closed else None
    if held is not None:
        session.expire(held)


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

"""Claims: a pending job given to a worker as a new attempt, and what follows, whoever
claimed it (a worker's claim request, `api/routes/internal.py`, or the admission that handed
the job to a worker, `handoff.py`).

Fencing: a claim bumps `attempt`; a worker's final report applies only for the current attempt
while the job runs (`finish.py`, the one place a job ends), so a stale attempt can never
overwrite a newer one and a terminal state is final. An attempt is closed once
(`end_attempt`): billing splits a worker's busy time among the attempts it ran.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import Celery
from sqlalchemy import bindparam, case, func, insert, text, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from common import tracing
from common.job_input import JobInput
from common.messages import Claim
from control_plane.db.models import Job, JobAttempt
from control_plane.domain.spec import Spec
from control_plane.domain.states import PENDING, JobStatus
from control_plane.services.jobs import job_store, job_traces
from control_plane.services.jobs.job_queries import states_sql
from control_plane.services.webhooks import signing
from control_plane.tasks_api import enqueue_output_follower, enqueue_webhook

log = logging.getLogger(__name__)


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
    if job is None or job.status not in PENDING or job_store.ttl_passed(job, now):
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


def answer(job: Job, spec: Spec, priority: int | None = None) -> Claim:
    """What the worker gets for a claimed job; its execution limit from the deployment's
    current `spec`; `priority`: on a hand-off (a claim's worker knows it from its wake-up)."""
    return Claim(
        job_id=job.id,
        attempt=job.attempt,
        input=JobInput.from_dict(job.input),
        execution_timeout_s=spec.execution_limit_s(job.execution_timeout_s),
        deployment=job.deployment_name,
        # the worker's spans join the job's trace (None: not traced)
        traceparent=job.traceparent,
        priority=priority,
    )


def announce(
    celery: Celery,
    sessions: sessionmaker[Session],
    job: Job,
    worker_id: str,
    at: datetime,
    session: Session | None = None,
) -> None:
    """After the commit and its `running` event: the job's webhooks (through `celery`), the
    trace of its wait (in `session`, or one of `sessions` when tracing is on)."""
    if job.webhook_url and "started" in (job.webhook_events or []):
        try:
            msg_id = signing.message_id(job.id, "started", job.attempt)
            enqueue_webhook(celery, job.id, "job.started", msg_id)
        except Exception:
            log.exception("could not enqueue the started webhook of job %s", job.id)
    if job.webhook_url and "output" in (job.webhook_events or []):
        try:
            enqueue_output_follower(celery, job.id, job.attempt)
        except Exception:
            log.exception("could not start output webhooks for job %s", job.id)
    if tracing.enabled():  # its wait from admission to this claim, and the cold start in it
        try:
            if session is not None:
                job_traces.record_wait(session, job, worker_id, at)
            else:
                with sessions() as own:
                    job_traces.record_wait(own, job, worker_id, at)
        except Exception:  # after the commit: a trace never fails the claim
            log.warning("could not trace the wait of job %s", job.id, exc_info=True)

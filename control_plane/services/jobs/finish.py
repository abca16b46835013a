"""Finishing a job: the one path from an active job to a terminal state.

Every terminal path calls `finish` — the worker's report (succeeded, failed, canceled,
timed_out), a user's cancel of a job or a batch, the reconcilers' expiry, execution overrun,
crash-loop failure and worker-lost-too-often failure, and a claim that finds the ttl passed.
For each job it

    1. writes the row with a conditional UPDATE (only from the states the ending allows, and
       for a worker's report only for the current attempt: the fence), closes the running
       attempt for billing, and sets `webhook_status`;
    2. gives the slot of a batch line that held one to the batch's next waiting line
       (`batch_slots.hand_over`), then commits (the database is the truth before anyone hears
       of it: DESIGN §5);
    3. hands a sync job's end to its caller if it waits in this process (`local_ends.py`),
       then sets the cancel flag of a job a worker may still hold, publishes the terminal event
       of its status, counts it out of its deployment's jobs in flight (the autoscaler's,
       `arrivals.py`), and enqueues `job.completed` with a message id that is the same for
       every path (`webhooks.message_id`), so a repeated announcement is one message to the
       receiver;
    4. wakes the batch lines that got a slot, and the loop when a batch has no line left
       (the loop's pump completes it);
    5. then logs and counts it (`metrics.families.job_ended`): a sync caller waits for step 3
       alone.

A job already terminal (or past its attempt) is left alone and not announced again.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Update, bindparam, text, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from common.protocol import CANCEL_FLAG_TTL_S, EventType, job_cancel_key
from control_plane.db.models import Job
from control_plane.domain.endings import Ending
from control_plane.domain.states import JobKind, JobStatus
from control_plane.metrics import families
from control_plane.services.jobs import batch_slots, claims, events, job_store
from control_plane.services.jobs.job_queries import states_sql
from control_plane.services.jobs.outbox import Outbox
from control_plane.services.scaling import arrivals
from control_plane.services.webhooks import signing
from control_plane.tasks_api import enqueue_webhook

log = logging.getLogger(__name__)

# The event that ends a job's stream, per terminal status.
EVENT_OF_STATUS = {
    JobStatus.SUCCEEDED: EventType.COMPLETED,
    JobStatus.FAILED: EventType.FAILED,
    JobStatus.CANCELED: EventType.CANCELED,
    JobStatus.EXPIRED: EventType.EXPIRED,
    JobStatus.TIMED_OUT: EventType.TIMED_OUT,
}
COMPLETED_WEBHOOK = "job.completed"


def finish(
    session: Session, outbox: Outbox, endings: Sequence[tuple[str, Ending]], now: datetime
) -> list[Job]:
    """End each `(job id, ending)` that still may end; commit; announce. Returns the jobs ended.

    Other changes pending in `session` are committed with them (a batch's own status, say),
    so a group of jobs and what ended them change in one transaction.
    """
    ended: list[tuple[Job, bool]] = []
    for job_id, ending in endings:
        result = _end(session, job_id, ending, now)
        if result is not None:
            ended.append(result)
    # a batch line that ended gives its slot to the batch's next line, in this transaction
    handover = batch_slots.hand_over(session, (job for job, _ in ended), now)
    session.commit()
    _announce(outbox, ended)
    batch_slots.wake(outbox.redis, handover, now)
    # after the announcement: a sync caller waits for it, not for these
    for job, _ in ended:
        _log_end(job, now)
        families.job_ended(job)  # by status, and its latencies from its own timestamps
    return [job for job, _ in ended]


def _log_end(job: Job, now: datetime) -> None:
    # the error's type, never its message: a message may quote the input
    reason = job.status_reason or (job.error or {}).get("type")
    log.info(
        "job %s %s",
        job.id,
        job.status,
        extra={
            "job_id": job.id,
            "deployment_id": job.deployment_id,
            "batch_id": job.batch_id,
            "attempt": job.attempt,
            "kind": job.kind,
            "status": job.status,
            "reason": reason,
            "duration_s": round((now - job.created_at).total_seconds(), 3),
        },
    )


def _end(session: Session, job_id: str, ending: Ending, now: datetime) -> tuple[Job, bool] | None:
    """Write the terminal row (not committed); (job, it was running) or None if it may not end."""
    if ending.attempt is not None:
        return _end_reported(session, job_id, ending, now)
    job = session.get(Job, job_id)
    if job is None or job.status not in ending.only_from:
        return None
    was_running = job.status == JobStatus.RUNNING
    values = _ending_values(ending, now, webhook_status=_webhook_status(job))
    statement = _end_statement(tuple(values), ending.only_from, fenced=False)
    res = session.execute(statement, _end_params(values, job_id, ending))
    if res.rowcount == 0:  # type: ignore[attr-defined]
        return None  # another path ended it first, or the attempt is stale
    # The row now holds exactly these values (nothing is computed by the database): set them
    # on the loaded object instead of reading the row back.
    for key, value in values.items():
        set_committed_value(job, key, value)
    if was_running:
        _end_attempt(session, job, ending, now)
    # A worker that reported the end itself holds nothing more; any other path may race it.
    return job, was_running and ending.attempt is None


def _end_reported(
    session: Session, job_id: str, ending: Ending, now: datetime
) -> tuple[Job, bool] | None:
    """`_end` of a worker's report: one UPDATE that returns the row, instead of a read and then
    the UPDATE. The read was the costliest statement of a job's end (an ORM load), and a report
    needs none to be judged: the fence (running, this attempt) is the UPDATE's condition. Only
    for reports: their session is the request's own, so no object of the row is loaded in it
    that this would leave stale."""
    assert ending.only_from == frozenset({JobStatus.RUNNING}), "a report ends a running job"
    values = _ending_values(ending, now, webhook_status="none")
    statement = _end_statement(tuple(values), ending.only_from, fenced=True, returning=True)
    row = session.execute(statement, _end_params(values, job_id, ending)).first()
    if row is None:
        return None  # not running (another path ended it first), or the attempt is stale
    job = Job(**row._mapping)  # the row as written; not attached to the session
    if _webhook_status(job) == "pending":  # it asked for `completed`: rare, a second UPDATE
        session.execute(_WEBHOOK_PENDING, {"b_id": job_id})
        job.webhook_status = "pending"
    _end_attempt(session, job, ending, now)
    return job, False  # the worker that reported the end holds nothing more


def _end_params(values: dict[str, Any], job_id: str, ending: Ending) -> dict[str, Any]:
    params = {f"b_{key}": value for key, value in values.items()}
    params["b_id"] = job_id
    if ending.attempt is not None:
        params["b_attempt"] = ending.attempt
    return params


def _ending_values(ending: Ending, now: datetime, *, webhook_status: str) -> dict[str, Any]:
    """The columns an ending writes."""
    values: dict[str, Any] = {
        "status": ending.status.value,
        "completed_at": now,
        "webhook_status": webhook_status,
    }
    if ending.reason is not None:
        values["status_reason"] = ending.reason
    if ending.error is not None:
        values["error"] = ending.error
    if ending.attempt is not None:  # the worker's report carries the results
        values.update(
            output=ending.output,
            error=ending.error,
            prompt_tokens=ending.prompt_tokens,
            generated_tokens=ending.generated_tokens,
        )
    return values


def _end_attempt(session: Session, job: Job, ending: Ending, now: datetime) -> None:
    """Close the running attempt of a job that ended. A user's cancel and an overrun are billed
    up to now, like a worker's own report; an attempt lost with its worker was already closed
    (unbilled) by the reconciler."""
    cached = (ending.output or {}).get("cached_tokens")
    claims.end_attempt(
        session,
        job.id,
        job.attempt,
        ending.status.value,
        now,
        prompt_tokens=ending.prompt_tokens,
        generated_tokens=ending.generated_tokens,
        cached_tokens=cached if isinstance(cached, int) else None,
    )


@functools.cache
def _end_statement(
    columns: tuple[str, ...],
    only_from: frozenset[JobStatus],
    *,
    fenced: bool,
    returning: bool = False,
) -> Update:
    """The conditional UPDATE that ends a job, built once per shape (a handful: the columns an
    ending sets, the states it ends from, fenced by attempt or not, returning the row or not):
    a Core UPDATE of the table with bound values. Built per call through the ORM it cost more
    than the rest of the job's end (its construction, its cache key, an expanding IN)."""
    jobs_table = Job.metadata.tables["jobs"]
    states = text(f"status IN ({states_sql(only_from)})")
    where: list[Any] = [jobs_table.c.id == bindparam("b_id"), states]
    if fenced:
        where.append(jobs_table.c.attempt == bindparam("b_attempt"))
    statement = update(jobs_table).where(*where).values({c: bindparam(f"b_{c}") for c in columns})
    return statement.returning(*jobs_table.c) if returning else statement


_WEBHOOK_PENDING = (
    update(Job.metadata.tables["jobs"])
    .where(Job.metadata.tables["jobs"].c.id == bindparam("b_id"))
    .values(webhook_status="pending")
)


def _webhook_status(job: Job) -> str:
    return "pending" if job.webhook_url and "completed" in (job.webhook_events or []) else "none"


def _announce(outbox: Outbox, ended: list[tuple[Job, bool]]) -> None:
    """Best effort after the commit: the row is the truth, readers fall back to it. Every
    job's flag and end go in one round trip (a worker reports the jobs that end together)."""
    if not ended:
        return
    try:
        ends = [
            (EVENT_OF_STATUS[JobStatus(job.status)], job_store.to_public(job)) for job, _ in ended
        ]
        if outbox.local is not None:  # a caller waiting here answers during the round trip
            handed = [
                outbox.local.deliver(job.id, end)
                for (job, _), end in zip(ended, ends, strict=True)
                if job.kind == JobKind.SYNC
            ]
            if any(handed):
                # Give the GIL up once: the caller's event loop, just woken by the handover,
                # then answers before this thread builds the round trip below (it waited for
                # this thread's next I/O: the answer stage 0.90x in bench/ab_warm_path.py runs).
                time.sleep(0)
        pipe = outbox.redis.pipeline(transaction=False)
        for (job, was_running), (event, public) in zip(ended, ends, strict=True):
            if was_running:  # a worker may still hold it
                pipe.set(job_cancel_key(job.id), "1", ex=CANCEL_FLAG_TTL_S)
            # a sync job's caller waits for its end alone (`events.wait_end`)
            events.end_to(pipe, job.id, event, public, waited_on=job.kind == JobKind.SYNC)
            if was_running or job.dispatched_at is not None:  # counted in flight at admission
                arrivals.ended_to(pipe, job.deployment_id)
        pipe.execute()
    except Exception:
        log.exception("could not publish the end of %d jobs (%s, ...)", len(ended), ended[0][0].id)
    for job, _ in ended:
        if job.webhook_status == "pending":
            try:
                msg_id = signing.message_id(job.id, "completed")
                enqueue_webhook(outbox.celery, job.id, COMPLETED_WEBHOOK, msg_id)
            except Exception:
                log.exception("job %s: could not enqueue its completed webhook", job.id)

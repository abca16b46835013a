"""Reconcilers of job lifecycles: requeue the jobs of dead workers, expire jobs whose ttl
passed, time out jobs far past their execution limit, re-send lost wake-ups, and forget the
broker's unacked wake-ups that nothing needs (domain/wakeups.py).

Every job that ends here ends through `services.jobs.finish` (the one path to a terminal state).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

import redis
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from common import tracing
from common.protocol import (
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_JOBS_FIELD,
    deployment_queue,
    worker_heartbeat_key,
)
from control_plane.db.models import Job, Worker
from control_plane.domain.fleet import Held, retries_left, unheld
from control_plane.domain.states import PENDING, JobStatus
from control_plane.domain.wakeups import JobState, stale
from control_plane.reconcile import tick_trace
from control_plane.reconcile.env import Env
from control_plane.services.jobs import claims, finish, job_queries
from control_plane.services.jobs.dispatch import (
    dispatch_job,
    forget_unacked,
    queue_depth,
    unacked_wakeups,
    wake,
)

log = logging.getLogger(__name__)
# The worker enforces execution limits itself; the control plane steps in after this grace.
EXECUTION_GRACE_S = 30.0
# A live worker claims a delivered wake-up, and acks a finished job's, well within this.
WAKEUP_GRACE_S = 10.0
# A job handed to a worker is popped within milliseconds of its commit; one its worker's beats
# still do not list this long after a beat that followed the commit was never received (five
# heartbeats: a worker whose threads are starved for a few seconds is not robbed of a job).
HANDOFF_GRACE_S = 5 * HEARTBEAT_INTERVAL_S
# A requeued (or failed) job's status_reason: its worker died, or never received it.
WORKER_LOST, HANDOFF_LOST = "worker_lost", "handoff_lost"
_IN_CHUNK = 500  # ids per IN (...) query


def requeue_orphans(session: Session, env: Env, dead: list[str], now: datetime) -> None:
    """Running jobs of dead workers go back to the queue as a new attempt, or fail once they
    lost MAX_ATTEMPTS workers. The lost attempt ends where its worker's life ended."""
    lost = []
    for job in job_queries.running_on(session, dead):
        w = session.get(Worker, job.worker_id) if job.worker_id else None
        lost.append((job.id, job.attempt, (w.stopped_at if w is not None else None) or now))
    _take_back(session, env, lost, WORKER_LOST, "the worker running this job stopped", now)


def _take_back(
    session: Session,
    env: Env,
    lost: list[tuple[str, int, datetime]],
    reason: str,
    lost_how: str,
    now: datetime,
) -> None:
    """Attempts their worker lost (job id, attempt, when it ended): each job back in the queue
    as a new attempt, or failed once it lost MAX_ATTEMPTS (error `lost_how` N times). The
    attempt ends unbilled; its number stays the fence, so a late report of it can no longer
    apply. A job that moved on meanwhile (its report arrived: it ended) is left as it is."""
    requeued, exhausted = [], []
    for job_id, attempt, ended_at in lost:
        claims.end_attempt(session, job_id, attempt, WORKER_LOST, ended_at)
        if not retries_left(attempt):
            error = {"type": WORKER_LOST, "message": f"{lost_how} {attempt} times"}
            exhausted.append((job_id, finish.failed(error, reason)))  # (only if still active)
            continue
        taken = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.attempt == attempt, Job.status == JobStatus.RUNNING)
            .values(status=JobStatus.QUEUED, status_reason=reason, worker_id=None)
            .returning(Job.deployment_id, Job.kind, Job.traceparent)
        ).first()
        if taken is not None:
            requeued.append((job_id, attempt, ended_at, taken))
    finish.finish(session, env.outbox, exhausted, now)  # commits the requeues too
    for job_id, attempt, ended_at, (dep_id, kind, traceparent) in requeued:
        log.warning(
            "job %s lost its worker (%s); requeued (attempt %d)",
            job_id,
            reason,
            attempt,
            extra={"job_id": job_id, "deployment_id": dep_id, "attempt": attempt, "reason": reason},
        )
        wake(env.redis, dep_id, job_id, kind, {"reason": reason})
        ids = {tracing.JOB_ID: job_id, tracing.JOB_ATTEMPT: attempt}
        tick_trace.note("job.requeue", **ids)
        tick_trace.requeued(traceparent, ended_at, now, **ids, **{"platform.job.reason": reason})


def requeue_unheld(
    session: Session, env: Env, missing_since: dict[tuple[str, int], float], now: datetime
) -> None:
    """Running jobs their live worker never received (a job handed to it at admission whose
    push was lost: services/jobs/handoff.py) go back to the queue as a new attempt, or fail once
    they lost MAX_ATTEMPTS. Only workers that list what they hold in their heartbeat are
    judged; a Redis that cannot be read leaves it for the next tick. `missing_since`: the
    reconciler's memory across ticks (`fleet.unheld`), updated here."""
    running: list[tuple[str, int, str]] = [
        (job_id, attempt, str(worker_id))
        for job_id, attempt, worker_id in session.execute(_RUNNING_ON_HANDOFF_WORKERS)
    ]
    worker_ids = sorted({worker_id for _, _, worker_id in running})
    try:
        beats = env.redis.mget([worker_heartbeat_key(w) for w in worker_ids]) if running else []
    except redis.RedisError as exc:
        log.info("held jobs not checked: %s", type(exc).__name__)
        return
    held = {w: h for w, beat in zip(worker_ids, beats, strict=True) if (h := _held(beat))}
    lost, still = unheld(running, held, missing_since, HANDOFF_GRACE_S)
    missing_since.clear()
    missing_since.update(still)
    lost_at = [(job_id, attempt, now) for job_id, attempt in lost]
    _take_back(session, env, lost_at, HANDOFF_LOST, "the job was not received by its worker", now)


def _held(beat: bytes | str | None) -> Held | None:
    """What a beat says its worker holds; None without a list (a worker that claims only)."""
    if beat is None:
        return None
    try:
        doc = json.loads(beat)
        ids = doc[HEARTBEAT_JOBS_FIELD]
        return Held(float(doc["at"]), frozenset(str(i) for i in ids))
    except (ValueError, KeyError, TypeError):
        return None


# The running jobs of the workers that take hand-offs (the others claim every job they hold).
# `status = 'running'` as a literal: the partial index of running jobs serves it.
_RUNNING_ON_HANDOFF_WORKERS = (
    select(Job.id, Job.attempt, Job.worker_id)
    .join(Worker, Worker.id == Job.worker_id)
    .where(text("jobs.status = 'running'"), Worker.takes_handoffs.is_(True))
)


def expire_overdue(session: Session, env: Env, now: datetime) -> None:
    """Pending jobs whose ttl passed before a worker claimed them become `expired`."""
    overdue = job_queries.overdue_ids(session, now)
    finish.finish(session, env.outbox, [(i, finish.expired()) for i in overdue], now)


def time_out_overruns(session: Session, env: Env, now: datetime) -> None:
    """Running jobs far past their limit (the worker missed it) become `timed_out`."""
    overrun = job_queries.overrunning(session, EXECUTION_GRACE_S, now)
    endings = [(job_id, finish.timed_out(limit_s)) for job_id, limit_s in overrun]
    finish.finish(session, env.outbox, endings, now)


def redispatch(session: Session, env: Env) -> None:
    """Re-send wake-ups only where jobs wait but their queue is empty (a lost message)."""
    rows = session.execute(
        select(Job.id, Job.deployment_id, Job.kind).where(
            Job.status.in_([s.value for s in PENDING]),
            # Batch jobs without a slot must stay asleep: the batch pump dispatches them.
            Job.dispatched_at.is_not(None),
        )
    ).all()
    empty: dict[str, bool] = {}
    for job_id, dep_id, kind in rows:
        if dep_id not in empty:
            empty[dep_id] = queue_depth(env.celery, deployment_queue(dep_id)) == 0
        if empty[dep_id]:
            log.info(
                "re-sending the wake-up of job %s",
                job_id,
                extra={"job_id": job_id, "deployment_id": dep_id},
            )
            dispatch_job(env.redis, dep_id, job_id, kind)


def forget_stale_wakeups(session: Session, env: Env, now: datetime) -> int:
    """Forget the unacked wake-ups nothing needs (a dead worker's, the ack a broker restart
    lost); returns how many. A broker that cannot be reached is left for the next tick."""
    cutoff = now.timestamp()
    try:
        entries = unacked_wakeups(env.redis, cutoff - WAKEUP_GRACE_S)
        if not entries:
            return 0
        ids = sorted({e.job_id for e in entries if e.job_id is not None})
        states: dict[str, JobState] = {}
        for i in range(0, len(ids), _IN_CHUNK):
            rows = session.execute(
                select(Job.id, Job.status, Job.completed_at).where(
                    Job.id.in_(ids[i : i + _IN_CHUNK])
                )
            ).all()
            for job_id, status, completed_at in rows:
                done = completed_at.timestamp() if completed_at is not None else None
                states[job_id] = JobState(status, done)
        tags = stale(entries, states, cutoff, WAKEUP_GRACE_S)
        if tags:
            forget_unacked(env.redis, tags)
            log.info("forgot %d unacked wake-ups nothing needs", len(tags))
        return len(tags)
    except redis.RedisError as exc:
        log.info("unacked wake-ups not checked: %s", type(exc).__name__)
        return 0

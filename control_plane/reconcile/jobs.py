"""Reconcilers of job lifecycles: requeue the jobs of dead workers, expire jobs whose ttl
passed, time out jobs far past their execution limit, and re-send lost wake-ups.

Every job that ends here ends through `services.finish` (the one path to a terminal state).
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Job, Worker
from control_plane.domain.fleet import retries_left
from control_plane.domain.states import PENDING, JobStatus
from control_plane.reconcile.env import Env
from control_plane.services import finish, job_queries, jobs
from control_plane.services.dispatch import dispatch_job, queue_depth, wake
from worker.protocol import deployment_queue

log = logging.getLogger(__name__)
# The worker enforces execution limits itself; the control plane steps in after this grace.
EXECUTION_GRACE_S = 30.0


def requeue_orphans(session: Session, env: Env, dead: list[str], now: datetime) -> None:
    """Running jobs of dead workers go back to the queue as a new attempt, or fail once they
    lost MAX_ATTEMPTS workers. The lost attempt ends where its worker's life ended, unbilled;
    its number stays the fence, so a late report of it can no longer apply."""
    requeued, exhausted = [], []
    for job in job_queries.running_on(session, dead):
        w = session.get(Worker, job.worker_id) if job.worker_id else None
        ended_at = (w.stopped_at if w is not None else None) or now
        jobs.end_attempt(session, job.id, job.attempt, "worker_lost", ended_at)
        if retries_left(job.attempt):
            job.status, job.status_reason, job.worker_id = JobStatus.QUEUED, "worker_lost", None
            requeued.append(job)
        else:
            error = {
                "type": "worker_lost",
                "message": f"the worker running this job stopped {job.attempt} times",
            }
            exhausted.append((job.id, finish.failed(error, "worker_lost")))
    finish.finish(session, env.outbox, exhausted, now)  # commits the requeues too
    for job in requeued:
        log.warning("job %s lost its worker; requeued (attempt %d)", job.id, job.attempt)
        wake(env.redis, env.celery, job.deployment_id, job.id, job.kind, {"reason": "worker_lost"})


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
            log.info("re-sending the wake-up of job %s", job_id)
            dispatch_job(env.celery, dep_id, job_id, kind)

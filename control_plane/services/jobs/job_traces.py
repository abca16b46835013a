"""The control plane's part of a job's trace that no request span covers: its wait in the queue,
drawn when its first attempt is claimed, with the cold start it waited on (docs/observability.md
"Traces"):

    job.queue                    created → first claim
    ├── worker.boot              the claiming worker's boot, within the wait
    ├── worker.load              its weight load
    └── worker.warm              its warm-up

The phases come from the worker's billing records (services/jobs/timeline.py reads the same for the
console): a job that waited on a cold start shows where those seconds went, and why that worker
was started (`platform.worker.start_reason`: the autoscaler's reason). Only the job's tenant's
records count: a warm-pool worker's time before its assignment is the platform's. Nothing here
runs when tracing is off.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from common import tracing
from control_plane.db.models import Job, Worker
from control_plane.services.jobs import timeline

START_REASON = "platform.worker.start_reason"
ACCELERATOR = "platform.worker.accelerator"


def record_wait(session: Session, job: Job, worker_id: str, at: datetime) -> None:
    """`job.queue` (and the claiming worker's phases under it) for `job`, claimed at `at` by
    `worker_id`: only at its first attempt (a retry's wait starts at an instant not kept)."""
    if not tracing.enabled() or job.attempt != 1:
        return
    queue = tracing.record_span(
        "job.queue",
        job.traceparent,
        job.created_at,
        at,
        {
            tracing.JOB_ID: job.id,
            tracing.DEPLOYMENT_ID: job.deployment_id,
            tracing.WORKER_ID: worker_id,
        },
    )
    if queue is None:
        return
    records = timeline.wait_records(session, job.tenant_id, [worker_id])
    phases = timeline.waited_on(records, worker_id, job.created_at, at)
    if not phases:
        return  # the worker was warm when the job arrived
    w = session.get(Worker, worker_id)
    for p in phases:
        tracing.record_span(
            f"worker.{p.phase}",
            queue,
            p.start,
            p.end or at,
            {
                tracing.WORKER_ID: worker_id,
                ACCELERATOR: w.accelerator if w is not None else None,
                START_REASON: w.reason if w is not None else None,
            },
        )

"""What follows a job's claim, whoever claimed it: a worker's claim request
(`api/routes/internal.py`) or the admission that handed the job to a worker
(`services/jobs/handoff.py`). The claim itself is `services/jobs/job_store.claim` /
`claim_queued`."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from common import tracing
from control_plane.db.models import Job
from control_plane.domain.spec import Spec
from control_plane.services.jobs import job_traces
from control_plane.services.webhooks import signing
from control_plane.tasks_api import enqueue_output_follower, enqueue_webhook

if TYPE_CHECKING:
    from control_plane.context import AppContext

log = logging.getLogger(__name__)


def answer(job: Job, spec: Spec) -> dict[str, Any]:
    """What the worker gets for a claimed job; its execution limit from the deployment's
    current `spec`."""
    return {
        "claimed": True,
        "job_id": job.id,
        "attempt": job.attempt,
        "input": job.input,
        "execution_timeout_s": spec.execution_limit_s(job.execution_timeout_s),
        # the worker's spans join the job's trace (None: not traced); the name for its spans
        "traceparent": job.traceparent,
        "deployment": job.deployment_name,
    }


def announce(
    ctx: AppContext, job: Job, worker_id: str, at: datetime, session: Session | None = None
) -> None:
    """After the commit and its `running` event: the job's webhooks, the trace of its wait
    (in `session`, or one of its own when tracing is on)."""
    if job.webhook_url and "started" in (job.webhook_events or []):
        try:
            msg_id = signing.message_id(job.id, "started", job.attempt)
            enqueue_webhook(ctx.celery, job.id, "job.started", msg_id)
        except Exception:
            log.exception("could not enqueue the started webhook of job %s", job.id)
    if job.webhook_url and "output" in (job.webhook_events or []):
        try:
            enqueue_output_follower(ctx.celery, job.id, job.attempt)
        except Exception:
            log.exception("could not start output webhooks for job %s", job.id)
    if tracing.enabled():  # its wait from admission to this claim, and the cold start in it
        try:
            if session is not None:
                job_traces.record_wait(session, job, worker_id, at)
            else:
                with ctx.sessions() as own:
                    job_traces.record_wait(own, job, worker_id, at)
        except Exception:  # after the commit: a trace never fails the claim
            log.warning("could not trace the wait of job %s", job.id, exc_info=True)

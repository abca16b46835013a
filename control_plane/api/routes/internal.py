"""Endpoints for workers (bearer: the worker token): claim, complete, lifecycle reports.

Workers hold no database credentials; every state change of a job or a worker goes through
here, so fencing and billing are enforced in one place.
"""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from control_plane.api.context import AppContext, Ctx, Db, now, worker_auth
from control_plane.api.schemas import ClaimRequest, CompleteRequest, WorkerStateReport
from control_plane.db.models import Deployment, Job
from control_plane.domain.states import JobStatus
from control_plane.errors import InvalidRequest
from control_plane.services import events, jobs, workers
from control_plane.tasks_api import enqueue_output_follower, enqueue_webhook
from worker.protocol import EventType, WorkerState

log = logging.getLogger(__name__)
router = APIRouter(prefix="/internal", dependencies=[Depends(worker_auth)], include_in_schema=False)

_EVENT_OF_STATUS = {
    JobStatus.SUCCEEDED: EventType.COMPLETED,
    JobStatus.CANCELED: EventType.CANCELED,
}


@router.post("/jobs/{job_id}/claim")
def claim(job_id: str, body: ClaimRequest, ctx: Ctx, session: Db) -> Any:
    job = jobs.claim(session, job_id, body.worker_id, now())
    session.commit()
    if job is None:
        return JSONResponse({"claimed": False}, status_code=409)
    dep = session.get(Deployment, job.deployment_id)
    assert dep is not None
    events.publish(
        ctx.redis, job.id, EventType.RUNNING, {"attempt": job.attempt, "worker_id": body.worker_id}
    )
    _maybe_webhook(ctx, job, "started")
    if job.webhook_url and "output" in (job.webhook_events or []):
        try:
            enqueue_output_follower(ctx.celery, job.id, job.attempt)
        except Exception:
            log.exception("could not start output webhooks for job %s", job.id)
    return {
        "claimed": True,
        "job_id": job.id,
        "attempt": job.attempt,
        "input": job.input,
        "execution_timeout_s": job.execution_timeout_s or dep.spec.get("execution_timeout_s", 600),
    }


@router.post("/jobs/{job_id}/complete")
def complete(job_id: str, body: CompleteRequest, ctx: Ctx, session: Db) -> Any:
    try:
        status = JobStatus(body.status)
    except ValueError:
        raise InvalidRequest(f"unknown status {body.status!r}") from None
    job = jobs.complete(
        session,
        job_id,
        body.attempt,
        status,
        now(),
        output=body.output,
        error=body.error,
        prompt_tokens=body.prompt_tokens,
        generated_tokens=body.generated_tokens,
    )
    if job.webhook_url and "completed" in (job.webhook_events or []):
        job.webhook_status = "pending"
    elif job.webhook_url:
        job.webhook_status = "none"
    session.commit()
    public = jobs.to_public(job)
    events.publish(ctx.redis, job.id, _EVENT_OF_STATUS.get(status, EventType.FAILED), public)
    _maybe_webhook(ctx, job, "completed")
    return {"ok": True}


@router.post("/workers/{worker_id}/state")
def worker_state(worker_id: str, body: WorkerStateReport, ctx: Ctx, session: Db) -> Any:
    try:
        state = WorkerState(body.state)
    except ValueError:
        raise InvalidRequest(f"unknown worker state {body.state!r}") from None
    at = datetime.fromtimestamp(body.at, UTC)
    w = workers.transition(session, ctx.settings, worker_id, state, at, now(), body.reason)
    w.last_heartbeat_at = now()
    session.commit()
    return {"ok": True, "state": w.state}


def _maybe_webhook(ctx: AppContext, job: Job, event: str) -> None:
    if not job.webhook_url or event not in (job.webhook_events or []):
        return
    msg_id = f"msg_{job.id}_{event}_{job.attempt}_{secrets.token_hex(3)}"
    try:
        enqueue_webhook(ctx.celery, job.id, f"job.{event}", msg_id)
    except Exception:
        log.exception("could not enqueue webhook for job %s", job.id)

"""Endpoints for workers (bearer: the worker token): claim, complete, lifecycle reports.

Workers hold no database credentials; every state change of a job or a worker goes through
here, so fencing and billing are enforced in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from control_plane.api.context import Ctx, Db, Now, worker_auth
from control_plane.api.schemas import ClaimRequest, CompleteRequest, WorkerStateReport
from control_plane.context import AppContext
from control_plane.db.models import Deployment, Job
from control_plane.domain.states import PENDING, TERMINAL, JobStatus
from control_plane.errors import Conflict, InvalidRequest
from control_plane.services import events, finish, job_traces, jobs, webhooks, workers
from control_plane.tasks_api import enqueue_output_follower, enqueue_webhook
from worker import tracing
from worker.protocol import EventType, WorkerState

log = logging.getLogger(__name__)
router = APIRouter(prefix="/internal", dependencies=[Depends(worker_auth)], include_in_schema=False)


# The two requests of every job (claim, complete) take one hop to a pool thread each: with a
# `Db` dependency FastAPI would also open and close the session on pool threads of their own.
@router.post("/jobs/{job_id}/claim")
async def claim(job_id: str, body: ClaimRequest, ctx: Ctx, at: Now) -> Any:
    return await run_in_threadpool(_in_session, _claim, ctx, job_id, body, at)


def _in_session(route: Callable[..., Any], ctx: AppContext, *args: Any) -> Any:
    """`route(ctx, session, *args)` with a session of its own, on the calling thread."""
    with ctx.sessions() as session:
        return route(ctx, session, *args)


def _claim(ctx: AppContext, session: Session, job_id: str, body: ClaimRequest, at: datetime) -> Any:
    pending = session.get(Job, job_id)
    if pending is not None and pending.status in PENDING and jobs.ttl_passed(pending, at):
        # Its ttl ran out while it waited: it ends here, never runs.
        finish.finish(session, ctx.outbox, [(job_id, finish.expired())], at)
        return JSONResponse({"claimed": False}, status_code=409)
    # the same worker claiming its running job again: its first answer was lost (jobs.claim)
    again = pending is not None and pending.status == JobStatus.RUNNING
    job = jobs.claim(session, job_id, body.worker_id, at)
    if job is not None and not again:
        workers.follow_jobs(session, ctx.settings, body.worker_id, at)  # busy, if it was idle
    session.commit()
    if job is None:
        return JSONResponse({"claimed": False}, status_code=409)
    dep = session.get(Deployment, job.deployment_id)
    assert dep is not None
    if again:  # the claim's events, webhooks and spans happened the first time
        return _claimed(job, dep)
    events.publish(
        ctx.redis, job.id, EventType.RUNNING, {"attempt": job.attempt, "worker_id": body.worker_id}
    )
    if job.webhook_url and "started" in (job.webhook_events or []):
        try:
            msg_id = webhooks.message_id(job.id, "started", job.attempt)
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
            job_traces.record_wait(session, job, body.worker_id, at)
        except Exception:  # after the commit: a trace never fails the claim
            log.warning("could not trace the wait of job %s", job.id, exc_info=True)
    return _claimed(job, dep)


def _claimed(job: Job, dep: Deployment) -> dict[str, Any]:
    return {
        "claimed": True,
        "job_id": job.id,
        "attempt": job.attempt,
        "input": job.input,
        "execution_timeout_s": dep.spec.execution_limit_s(job.execution_timeout_s),
        # the worker's spans join the job's trace (None: not traced); the name for its spans
        "traceparent": job.traceparent,
        "deployment": dep.name,
    }


@router.post("/jobs/{job_id}/complete")
async def complete(job_id: str, body: CompleteRequest, ctx: Ctx, at: Now) -> Any:
    return await run_in_threadpool(_in_session, _complete, ctx, job_id, body, at)


def _complete(
    ctx: AppContext, session: Session, job_id: str, body: CompleteRequest, at: datetime
) -> dict[str, bool]:
    try:
        status = JobStatus(body.status)
    except ValueError:
        raise InvalidRequest(f"unknown status {body.status!r}") from None
    if status not in TERMINAL:
        raise InvalidRequest(f"{status} is not a terminal status")
    ending = finish.reported(
        status,
        body.attempt,
        output=body.output,
        error=body.error,
        prompt_tokens=body.prompt_tokens,
        generated_tokens=body.generated_tokens,
    )
    # (its worker goes back to idle at the reconciler's next tick: workers.settle_idle)
    if not finish.finish(session, ctx.outbox, [(job_id, ending)], at):
        raise Conflict(
            f"attempt {body.attempt} of job '{job_id}' is no longer current", job_id=job_id
        )
    return {"ok": True}


@router.post("/workers/{worker_id}/state")
def worker_state(
    worker_id: str, body: WorkerStateReport, ctx: Ctx, session: Db, received: Now
) -> Any:
    try:
        state = WorkerState(body.state)
    except ValueError:
        raise InvalidRequest(f"unknown worker state {body.state!r}") from None
    at = datetime.fromtimestamp(body.at, UTC)
    w = workers.transition(session, ctx.settings, worker_id, state, at, received, body.reason)
    w.last_heartbeat_at = received
    session.commit()
    return {"ok": True, "state": w.state}

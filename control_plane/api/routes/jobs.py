"""Runs and jobs: sync (JSON or SSE) and async creation, reads, listing and cancel.

The run logic shared with other routes is in `services/jobs/admission.py`; this module is HTTP only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from control_plane.api import offload
from control_plane.api.context import Ctx, Db, Now, Principal, bearer_token
from control_plane.api.responses import JobList, JobPublic, JobTimeline
from control_plane.api.schemas import JobCreate, RunRequest
from control_plane.context import AppContext
from control_plane.db.models import Deployment
from control_plane.domain.eta import estimate_wait_s
from control_plane.domain.states import JobKind, is_terminal
from control_plane.services.jobs import (
    admission,
    callers,
    cold_starts,
    job_queries,
    job_store,
    timeline,
)
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)
router = APIRouter(tags=["jobs"])
KEEPALIVE_EVERY_S = 10
SERVING = frozenset({"idle", "busy"})


# One server-sent event of a streamed run (docs/api.md "Streaming"): its type and JSON data.
SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "description": "a JSON object"},
        "id": {"type": "string"},
    },
    "required": ["data"],
}


@router.post(
    "/v1/deployments/{name}/run",
    responses={
        200: {
            "model": JobPublic,
            "description": "finished within wait_s; with stream: true, its events as they come",
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        202: {"model": JobPublic, "description": "still running: poll GET /v1/jobs/{id}"},
    },
)
async def run(
    name: str,
    body: RunRequest,
    ctx: Ctx,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    # A retried sync call (dropped connection) with the same key follows the same job.
    job, tenant_id = await offload.in_thread(
        admission.create,
        ctx,
        bearer_token(authorization),
        name,
        body.input,
        JobKind.SYNC,
        idempotency_key=idempotency_key,
        request_hash=admission.request_hash(name, body.input.model_dump()),
    )
    job_id = job["id"]
    headers = {"X-Job-Id": job_id}
    if body.stream:
        headers["Cache-Control"] = "no-cache"
        return StreamingResponse(
            _sse(ctx, job_id, tenant_id), media_type="text/event-stream", headers=headers
        )
    if is_terminal(job["status"]):  # a replay of a call whose job has ended
        return JSONResponse(job, status_code=200, headers=headers)
    wait_s = min(body.wait_s or ctx.settings.sync_wait_default_s, ctx.settings.sync_wait_max_s)
    try:
        final = await callers.end_of(ctx, job_id, tenant_id, wait_s, request.is_disconnected)
    except callers.CallerGone:
        return Response(status_code=499, headers=headers)
    if final is None:  # still running: the job as it stands
        final = await offload.in_thread(callers.read, ctx, job_id, tenant_id)
    return JSONResponse(
        final, status_code=200 if is_terminal(final["status"]) else 202, headers=headers
    )


async def _sse(ctx: AppContext, job_id: str, tenant_id: str) -> AsyncIterator[str]:
    """The job's events (`callers.Follow`: its deltas add up to its output, a `restarted` event
    telling the client to discard its text when they cannot), keep-alives while silent."""
    idle_ticks = 0
    async for event, data in callers.Follow(ctx, job_id, tenant_id).events():
        if event is None:
            idle_ticks += 1
            if idle_ticks % KEEPALIVE_EVERY_S == 0:
                yield ": keep-alive\n\n"
            continue
        yield f"event: {event.value}\ndata: {json.dumps(data)}\n\n"


@router.post("/v1/deployments/{name}/jobs", status_code=202, responses={202: {"model": JobPublic}})
async def create_job(
    name: str,
    body: JobCreate,
    ctx: Ctx,
    authorization: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    request_hash = admission.request_hash(name, body.model_dump())
    job, _ = await offload.in_thread(
        admission.create,
        ctx,
        bearer_token(authorization),
        name,
        body.input,
        JobKind.ASYNC,
        webhook=body.webhook,
        webhook_events=body.webhook_events,
        ttl_s=body.ttl_s,
        execution_timeout_s=body.execution_timeout_s,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    return JSONResponse(job, status_code=202, headers={"X-Job-Id": job["id"]})


@router.get("/v1/jobs/{job_id}", responses={200: {"model": JobPublic}})
def get_job(job_id: str, ctx: Ctx, session: Db, who: Principal, at: Now) -> Any:
    who.require("read")
    row = job_store.get(session, who.tenant_id, job_id)
    job = job_store.to_public(row)
    position = job_queries.queue_position(session, row)
    # Only a waiting job gets an ETA: polls of running and finished jobs stay one query.
    dep = session.get(Deployment, row.deployment_id) if position is not None else None
    if position is not None and dep is not None:
        live = [w for w in worker_records.live(session, row.deployment_id) if w.state in SERVING]
        cold_start = None if live else _cold_start(ctx, row.deployment_id, at)
        if cold_start is not None:
            job["cold_start"] = cold_start
        per_worker = dep.spec.target_concurrency
        job["queue_position"] = position
        job["eta_s"] = estimate_wait_s(
            position,
            job_queries.recent_execution_s(session, row.deployment_id),
            len(live) * per_worker,
            cold_start["eta_s"] if cold_start else None,
        )
    return JSONResponse(job, headers={"X-Job-Id": job_id})


@router.get("/v1/jobs/{job_id}/timeline", response_model=JobTimeline)
def job_timeline(job_id: str, session: Db, who: Principal, at: Now) -> Any:
    """Where the job's time went: queue, the boot / load / warm of the worker it waited on,
    each attempt's run; and its cost share (services/jobs/timeline.py)."""
    who.require("read")
    return timeline.timeline(session, job_store.get(session, who.tenant_id, job_id), at)


def _cold_start(ctx: AppContext, deployment_id: str, at: datetime) -> dict[str, Any] | None:
    """The cold start the job waits on (phase, bytes, ETA), as the reconciler last saw it."""
    try:
        return cold_starts.read(ctx.redis, deployment_id, at.timestamp())
    except redis.RedisError as exc:
        log.warning("cold start of %s unreadable (Redis: %s)", deployment_id, exc)
        return None


@router.get("/v1/jobs", response_model=JobList)
def list_jobs(
    session: Db,
    who: Principal,
    deployment: str | None = None,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Any:
    who.require("read")
    rows, next_cursor = job_store.list_(
        session, who.tenant_id, deployment=deployment, status=status, limit=limit, cursor=cursor
    )
    return {"data": [job_store.to_public(j) for j in rows], "next_cursor": next_cursor}


@router.post("/v1/jobs/{job_id}/cancel", responses={200: {"model": JobPublic}})
def cancel_job(job_id: str, ctx: Ctx, who: Principal) -> Any:
    who.require("run")
    job = callers.cancel(ctx, job_id, who.tenant_id)
    return JSONResponse(job, headers={"X-Job-Id": job_id})

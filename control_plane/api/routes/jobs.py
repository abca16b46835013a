"""Runs and jobs: sync (JSON or SSE) and async creation, reads, listing and cancel."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.orm import Session

from control_plane.api.context import AppContext, Ctx, Db, Principal, now
from control_plane.api.schemas import JobCreate, JobInput, JobList, JobPublic, RunRequest
from control_plane.db.models import Deployment, Tenant
from control_plane.domain.eta import estimate_wait_s
from control_plane.domain.states import JobKind, is_terminal
from control_plane.errors import InvalidRequest, Unauthorized
from control_plane.services import auth, deployments, events, jobs, webhooks, workers
from control_plane.services.dispatch import wake
from control_plane.services.quotas import Limits
from worker.protocol import TERMINAL_EVENTS, EventType, job_cancel_key

log = logging.getLogger(__name__)
router = APIRouter(tags=["jobs"])
KEEPALIVE_EVERY_S = 10
SERVING = frozenset({"idle", "busy"})


def create_job_for(
    ctx: AppContext,
    authorization: str | None,
    name: str,
    job_input: JobInput,
    kind: JobKind,
    *,
    webhook: str | None = None,
    webhook_events: list[str] | None = None,
    ttl_s: float | None = None,
    execution_timeout_s: float | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> tuple[dict[str, Any], str]:
    """Commit the job, then wake a worker; returns (job, tenant id). Runs in a thread."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    with ctx.sessions() as session:
        who = auth.authenticate(session, authorization[7:].strip())
        who.require("run")
        dep = deployments.get(session, who.tenant_id, name)
        if webhook:
            webhooks.check_target(webhook, ctx.settings.webhook_allow_private)
        resolved = job_input.resolved(dep.spec.get("defaults") or {})
        prompt_tokens = check_fits_context(ctx, dep, resolved)
        if idempotency_key is None or not jobs.exists_for_key(
            session, who.tenant_id, idempotency_key
        ):
            admit(ctx, session, who.tenant_id, prompt_tokens + int(resolved["max_tokens"]))
        job, created = jobs.create(
            session,
            dep,
            resolved,
            kind,
            now(),
            webhook_url=webhook,
            webhook_events=webhook_events,
            ttl_s=ttl_s,
            execution_timeout_s=execution_timeout_s,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            api_key_id=who.key_id,
        )
        # NOTE: the commit comes before any acknowledgement or wake-up (DESIGN §5).
        session.commit()
        public = jobs.to_public(job)
        dep_id = dep.id
        tenant_id = who.tenant_id
    if created:
        wake(ctx.redis, ctx.celery, dep_id, public["id"], kind)
    return public, tenant_id


def admit(ctx: AppContext, session: Session, tenant_id: str, tokens: int) -> None:
    """Quota check of a new job (a replay of an idempotent request is not charged again)."""
    tenant = session.get(Tenant, tenant_id)
    s = ctx.settings
    limits = Limits(
        requests_per_min=(tenant and tenant.requests_per_min) or s.default_requests_per_min,
        tokens_per_min=(tenant and tenant.tokens_per_min) or s.default_tokens_per_min,
        max_in_flight=(tenant and tenant.max_in_flight) or s.default_max_in_flight,
    )
    ctx.quotas.admit(tenant_id, limits, tokens, jobs.active_count(session, tenant_id))


def check_fits_context(ctx: AppContext, dep: Deployment, resolved: dict[str, Any]) -> int:
    """Refuse a prompt that cannot fit the model's context, before anything is written.

    Returns the prompt's token count (an estimate when the model files are unreadable).
    """
    meta = ctx.model_meta.get(dep.id, dep.version, str(dep.spec["model"]))
    if meta is None:
        # Metadata unreadable: the worker checks and reports; ~4 characters per token.
        return len(resolved["prompt"]) // 4 + 1
    prompt_tokens = meta.count_prompt_tokens(resolved["prompt"])
    max_tokens = int(resolved["max_tokens"])
    if prompt_tokens + max_tokens > meta.max_context:
        raise InvalidRequest(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"context of {meta.max_context} tokens",
            errors=[{"field": "input.prompt", "message": "too long for the context"}],
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            limit=meta.max_context,
        )
    return prompt_tokens


def _request_hash(name: str, body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({"name": name, **body}, sort_keys=True).encode()).hexdigest()


def read_job(ctx: AppContext, job_id: str, tenant_id: str) -> dict[str, Any]:
    with ctx.sessions() as session:
        return jobs.to_public(jobs.get(session, tenant_id, job_id))


def _cancel(ctx: AppContext, job_id: str, tenant_id: str) -> dict[str, Any]:
    with ctx.sessions() as session:
        job, changed = jobs.cancel(session, tenant_id, job_id, now())
        session.commit()
        public = jobs.to_public(job)
    if changed:
        ctx.redis.set(job_cancel_key(job_id), "1", ex=24 * 3600)
        events.publish(ctx.redis, job_id, EventType.CANCELED, public)
    return public


@router.post(
    "/v1/deployments/{name}/run",
    responses={
        200: {"model": JobPublic, "description": "finished within wait_s"},
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
    job, tenant_id = await asyncio.to_thread(
        create_job_for,
        ctx,
        authorization,
        name,
        body.input,
        JobKind.SYNC,
        idempotency_key=idempotency_key,
        request_hash=_request_hash(name, body.input.model_dump()),
    )
    job_id = job["id"]
    headers = {"X-Job-Id": job_id}
    if body.stream:
        headers["Cache-Control"] = "no-cache"
        return StreamingResponse(
            _sse(ctx, job_id, tenant_id), media_type="text/event-stream", headers=headers
        )
    wait_s = min(body.wait_s or ctx.settings.sync_wait_default_s, ctx.settings.sync_wait_max_s)
    try:
        async with asyncio.timeout(wait_s):
            async for event, _ in events.follow(ctx.aredis, job_id, block_ms=500):
                if event in TERMINAL_EVENTS:
                    break
                if await request.is_disconnected():
                    # Nobody waits for this answer any more: free the worker's slot.
                    await asyncio.to_thread(_cancel_quietly, ctx, job_id, tenant_id)
                    return Response(status_code=499, headers=headers)
    except TimeoutError:
        pass
    final = await asyncio.to_thread(read_job, ctx, job_id, tenant_id)
    return JSONResponse(
        final, status_code=200 if is_terminal(final["status"]) else 202, headers=headers
    )


async def follow_or_cancel(
    ctx: AppContext, job_id: str, tenant_id: str
) -> AsyncIterator[tuple[EventType | None, dict[str, Any]]]:
    """A job's events until a terminal one; if the consumer goes away first (the client
    disconnected), the job is canceled so its worker frees the slot. `None` = idle tick."""
    finished = False
    try:
        async for event, data in events.follow(ctx.aredis, job_id):
            if event in TERMINAL_EVENTS:
                finished = True
            yield event, data
    finally:
        if not finished:
            # Not awaited: this task is being cancelled itself.
            asyncio.get_running_loop().run_in_executor(
                None, _cancel_quietly, ctx, job_id, tenant_id
            )


async def _sse(ctx: AppContext, job_id: str, tenant_id: str) -> AsyncIterator[str]:
    idle_ticks = 0
    async for event, data in follow_or_cancel(ctx, job_id, tenant_id):
        if event is None:
            idle_ticks += 1
            if idle_ticks % KEEPALIVE_EVERY_S == 0:
                yield ": keep-alive\n\n"
            continue
        yield f"event: {event.value}\ndata: {json.dumps(data)}\n\n"


def _cancel_quietly(ctx: AppContext, job_id: str, tenant_id: str) -> None:
    try:
        _cancel(ctx, job_id, tenant_id)
    except Exception:
        log.exception("cancel after disconnect failed for job %s", job_id)


@router.post("/v1/deployments/{name}/jobs", status_code=202, responses={202: {"model": JobPublic}})
async def create_job(
    name: str,
    body: JobCreate,
    ctx: Ctx,
    authorization: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    request_hash = _request_hash(name, body.model_dump())
    job, _ = await asyncio.to_thread(
        create_job_for,
        ctx,
        authorization,
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
def get_job(job_id: str, session: Db, who: Principal) -> Any:
    who.require("read")
    row = jobs.get(session, who.tenant_id, job_id)
    job = jobs.to_public(row)
    position = jobs.queue_position(session, row)
    if position is not None:
        dep = session.get(Deployment, row.deployment_id)
        live = [w for w in workers.live(session, row.deployment_id) if w.state in SERVING]
        per_worker = int((dep.spec if dep else {}).get("target_concurrency", 1))
        job["queue_position"] = position
        job["eta_s"] = estimate_wait_s(
            position,
            jobs.recent_execution_s(session, row.deployment_id),
            len(live) * per_worker,
            None,
        )
    return JSONResponse(job, headers={"X-Job-Id": job_id})


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
    rows, next_cursor = jobs.list_(
        session, who.tenant_id, deployment=deployment, status=status, limit=limit, cursor=cursor
    )
    return {"data": [jobs.to_public(j) for j in rows], "next_cursor": next_cursor}


@router.post("/v1/jobs/{job_id}/cancel", responses={200: {"model": JobPublic}})
def cancel_job(job_id: str, ctx: Ctx, who: Principal) -> Any:
    who.require("run")
    job = _cancel(ctx, job_id, who.tenant_id)
    return JSONResponse(job, headers={"X-Job-Id": job_id})

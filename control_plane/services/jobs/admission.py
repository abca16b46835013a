"""Runs: what a call of a deployment does, whichever route it came through (the platform's own
`/run` and `/jobs`, OpenAI's completions, batches' quota check).

    create        authenticate, resolve the input with the deployment's defaults, check it fits
                  the model's context and the tenant's quota, commit the job, then record its
                  arrival (the autoscaler's history) and wake a worker
    read / cancel a job of the caller's tenant (cancel ends it through `services.jobs.finish`)
    end_of        a sync job as it ended, for a caller that waits for the end alone
    follow_or_cancel  a job's events until its end; a consumer that goes away cancels it

`create` runs in a worker thread of the API (it does blocking SQL and Redis calls).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from sqlalchemy.orm import Session

from common import logs, tracing
from common.protocol import TERMINAL_EVENTS, EventType
from control_plane.context import AppContext
from control_plane.db.models import Job
from control_plane.domain.states import JobKind
from control_plane.errors import ControlPlaneError, InvalidRequest
from control_plane.metrics import families
from control_plane.services.jobs import claims, events, finish, handoff, job_queries, job_store
from control_plane.services.jobs.dispatch import wake
from control_plane.services.jobs.local_ends import End
from control_plane.services.tenants.api_keys import Principal
from control_plane.services.tenants.edge_cache import DeploymentRef, EdgeView, TenantLimits
from control_plane.services.tenants.quotas import Limits, StaleView
from control_plane.services.webhooks import signing

log = logging.getLogger(__name__)


class JobInput(Protocol):
    """A validated job input (`api.schemas.JobInput`)."""

    def resolved(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """The input with the deployment's `defaults`, then the platform's, filled in."""
        ...


def create(
    ctx: AppContext,
    token: str,
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
    """Commit the job, then wake a worker; returns (public job, tenant id).

    Traced as `job.admit` (events `stored`, `woken`); the job stores that span's traceparent."""
    attributes = {tracing.GEN_AI_OPERATION: tracing.OPERATION, tracing.GEN_AI_MODEL: name}
    with tracing.span("job.admit", attributes=attributes) as span:
        # The key, deployment and limits as of the generation last seen: the quota script
        # confirms it (edge_cache.py), sparing a round trip on every call.
        view = ctx.edge.recent_view()
        with ctx.sessions() as session:
            try:
                who, dep, resolved, replay = _decide(
                    ctx, session, view, token, name, job_input, webhook, idempotency_key
                )
            except (StaleView, ControlPlaneError):
                if view.fresh:
                    raise
                # The generation moved, or the call was refused on it: decided again on the
                # current one (nothing was charged or written).
                session.rollback()
                view = ctx.edge.view()
                who, dep, resolved, replay = _decide(
                    ctx, session, view, token, name, job_input, webhook, idempotency_key
                )
            # a worker with a free slot to hand the job to (handoff.py), read before the INSERT
            to = handoff.pick(session, ctx.settings, dep) if replay is None else None
            now = ctx.clock()
            job, created = job_store.create(
                session,
                dep,
                resolved,
                kind,
                now,
                webhook_url=webhook,
                webhook_events=webhook_events,
                ttl_s=ttl_s,
                execution_timeout_s=execution_timeout_s,
                idempotency_key=idempotency_key,
                request_hash=request_hash,
                api_key_id=who.key_id,
                replay=replay,
            )
            # Claimed for that worker in this transaction: it then needs no claim request.
            handed = None
            if created and to is not None:
                handed = handoff.give(session, ctx.settings, dep, job, to, now)
            # NOTE: the commit comes before any acknowledgement or wake-up (DESIGN §5).
            session.commit()
            public = job_store.to_public(job if handed is None else handed.job)
            dep_id = dep.id
            tenant_id = who.tenant_id
        if span is not None:
            span.set_attributes(
                {
                    tracing.JOB_ID: public["id"],
                    tracing.JOB_KIND: str(kind),
                    tracing.DEPLOYMENT_ID: dep_id,
                    tracing.GEN_AI_MAX_TOKENS: int(resolved["max_tokens"]),
                }
            )
            span.add_event("stored", {"platform.job.created": created})
        logs.bind(job_id=public["id"], deployment_id=dep_id)  # the request's log line names them
        if created:
            # The arrival goes in the wake-up's round trip. Every admitted call passes here
            # (run, stream, jobs, OpenAI); batch lines count when they are dispatched
            # (`services/jobs/batches.py`). Best effort: never fails the call.
            woken = wake(ctx.redis, dep_id, public["id"], kind, arrival=now, handoff=handed)
            if span is not None:
                span.add_event("woken", {"platform.wake.sent": woken})
            if handed is not None:
                claims.announce(ctx, handed.job, handed.worker_id, now)
                families.job_handed_off(handed.job)
    return public, tenant_id


def _decide(
    ctx: AppContext,
    session: Session,
    view: EdgeView,
    token: str,
    name: str,
    job_input: JobInput,
    webhook: str | None,
    idempotency_key: str | None,
) -> tuple[Principal, DeploymentRef, dict[str, Any], Job | None]:
    """Whether the call is admitted, charged to its tenant's quota: (caller, deployment, input
    with the deployment's defaults, the job an earlier call with `idempotency_key` created).
    Reads only; the charge is the last step (the quota script runs while the earlier call is
    looked up and the tenant's jobs are counted), and a replay is given its charge back. On a
    view not `fresh`, StaleView when its generation moved (nothing charged)."""
    who = view.principal(session, token)
    who.require("run")
    dep = view.deployment(session, who.tenant_id, name)
    if webhook:
        signing.check_target(webhook, ctx.settings.webhook_allow_private)
    resolved = job_input.resolved(dep.spec.defaults)
    prompt_tokens = check_fits_context(ctx, dep, resolved)
    tokens = prompt_tokens + int(resolved["max_tokens"])
    own = view.limits(session, who.tenant_id)
    generation = None if view.fresh else view.generation
    replay = admit(ctx, session, who.tenant_id, tokens, own, generation, idempotency_key)
    return who, dep, resolved, replay


def admit(
    ctx: AppContext,
    session: Session,
    tenant_id: str,
    tokens: int,
    own: TenantLimits,
    generation: int | None = None,
    idempotency_key: str | None = None,
) -> Job | None:
    """Quota check of a new job, charged to the tenant; the job an earlier call with
    `idempotency_key` created, when this is a replay (given its charge back). The key's lookup
    and the in-flight count run while the quota script does (`Quotas.admit`); `generation`:
    see there."""
    s = ctx.settings
    limits = Limits(
        requests_per_min=own.requests_per_min or s.default_requests_per_min,
        tokens_per_min=own.tokens_per_min or s.default_tokens_per_min,
        max_in_flight=own.max_in_flight or s.default_max_in_flight,
    )
    replay: Job | None = None

    def count_in_flight() -> int | None:
        nonlocal replay
        if idempotency_key is not None:
            replay = job_store.replay_of(session, tenant_id, idempotency_key)
            if replay is not None:
                return None  # a replay is not charged again
        # Counting stops at the limit: the answer needed is only whether the tenant is at it.
        return job_queries.active_count(session, tenant_id, limits.max_in_flight)

    ctx.quotas.admit(tenant_id, limits, tokens, count_in_flight, generation)
    return replay


def check_fits_context(ctx: AppContext, dep: DeploymentRef, resolved: dict[str, Any]) -> int:
    """Refuse a prompt that cannot fit the model's context, before anything is written.

    Returns the prompt's token count (an estimate when the model files are unreadable).
    """
    meta = ctx.model_meta.get(dep.id, dep.version, dep.tenant_id, dep.spec.model)
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


def request_hash(name: str, body: dict[str, Any]) -> str:
    """What an Idempotency-Key is bound to: the deployment and the request body."""
    return hashlib.sha256(json.dumps({"name": name, **body}, sort_keys=True).encode()).hexdigest()


def read(ctx: AppContext, job_id: str, tenant_id: str) -> dict[str, Any]:
    with ctx.sessions() as session:
        return job_store.to_public(job_store.get(session, tenant_id, job_id))


def cancel(ctx: AppContext, job_id: str, tenant_id: str) -> dict[str, Any]:
    """Cancel a job of this tenant unless it already ended; returns the job as it is now."""
    with ctx.sessions() as session:
        job = job_store.get(session, tenant_id, job_id)  # another tenant's job is a 404
        finish.finish(
            session, ctx.outbox, [(job_id, finish.canceled("canceled_by_user"))], ctx.clock()
        )
        return job_store.to_public(job)  # reloaded after the commit: the state it ended in


def cancel_quietly(ctx: AppContext, job_id: str, tenant_id: str) -> None:
    try:
        cancel(ctx, job_id, tenant_id)
    except Exception:
        log.exception("cancel after disconnect failed for job %s", job_id)


class CallerGone(Exception):
    """The caller of a sync job went away while it waited; the job was canceled."""


async def end_of(
    ctx: AppContext,
    job_id: str,
    tenant_id: str,
    wait_s: float,
    disconnected: Callable[[], Awaitable[bool]],
) -> dict[str, Any] | None:
    """A sync job as it ended, once it ends within `wait_s`; None when it did not (it runs on).

    Its end comes handed over in this process (`LocalEnds`: the worker's report reached it) or
    read from Redis (`events.wait_end`), whichever comes first; both carry the job as
    committed. Between reads (every half second) a caller that went away (`disconnected()`)
    cancels the job, so its worker frees the slot: CallerGone.
    """
    local = ctx.ends.expect(job_id)
    try:
        async with asyncio.timeout(wait_s):
            while True:
                end = await _end_from_either(ctx, job_id, local)
                if end is not None:
                    _event, job = end
                    if job.get("id") == job_id:
                        return job
                    return await asyncio.to_thread(read, ctx, job_id, tenant_id)
                if await disconnected():
                    await asyncio.to_thread(cancel_quietly, ctx, job_id, tenant_id)
                    raise CallerGone(job_id)
    except TimeoutError:
        return None
    finally:
        ctx.ends.forget(job_id, local)


async def _end_from_either(ctx: AppContext, job_id: str, local: asyncio.Future[End]) -> End | None:
    """The end handed over (`local`) or read from Redis, whichever first; None after the
    read's block."""
    if local.done():
        return local.result()
    remote = asyncio.ensure_future(events.wait_end(ctx.aredis, job_id, block_s=0.5))
    try:
        await asyncio.wait((local, remote), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        remote.cancel()
        raise
    if local.done():
        # The read ends within its block (the end it waits for is on its way); it consumes
        # nothing (`wait_end` rotates the list). Held until then: the loop keeps only a weak
        # reference to a task.
        _reads_left.add(remote)
        remote.add_done_callback(_left_read_done)
        return local.result()
    return remote.result()


_reads_left: set[asyncio.Future[Any]] = set()  # reads of ends handed over meanwhile


def _left_read_done(task: asyncio.Future[Any]) -> None:
    _reads_left.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception never retrieved" warning


async def follow_or_cancel(
    ctx: AppContext, job_id: str, tenant_id: str
) -> AsyncIterator[tuple[EventType | None, dict[str, Any]]]:
    """A job's events until a terminal one; if the consumer goes away first (the client
    disconnected), the job is canceled so its worker frees the slot. `None` = idle tick."""
    ended = False
    try:
        async for event, data in events.follow(ctx.aredis, job_id):
            if event in TERMINAL_EVENTS:
                ended = True
            yield event, data
    finally:
        if not ended:
            # Not awaited: this task is being cancelled itself.
            asyncio.get_running_loop().run_in_executor(None, cancel_quietly, ctx, job_id, tenant_id)

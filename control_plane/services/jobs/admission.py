"""Admission: what a call of a deployment does, whichever route it came through (the
platform's own `/run` and `/jobs`, OpenAI's completions, batches' quota check).

    create   authenticate, resolve the input with the deployment's defaults, check it fits the
             model's context and the tenant's quota, commit the job (handed to a worker with a
             free slot in the same transaction, `handoff.py`), then record its arrival (the
             autoscaler's history) and wake a worker
    admit    the quota check alone (batches charge their lines with it)

What the caller sees afterwards (read, cancel, the end, the events) is `callers.py`. `create`
runs in a worker thread of the API (it does blocking SQL and Redis calls).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Protocol

from sqlalchemy.orm import Session

from common import logs, tracing
from common.job_input import JobInput
from control_plane.context import AppContext
from control_plane.db.models import Job
from control_plane.domain.states import JobKind
from control_plane.errors import ContextTooLong, ControlPlaneError, InvalidRequest
from control_plane.metrics import families
from control_plane.services.jobs import claims, handoff, job_queries, job_store
from control_plane.services.jobs.dispatch import wake
from control_plane.services.tenants.api_keys import Principal
from control_plane.services.tenants.edge_cache import DeploymentRef, EdgeView, TenantLimits
from control_plane.services.tenants.quotas import Limits, StaleView
from control_plane.services.webhooks import targets

log = logging.getLogger(__name__)


class CallInput(Protocol):
    """A call's validated input (`api.schemas.JobInput`), before the defaults."""

    def resolved(self, defaults: dict[str, Any]) -> JobInput:
        """The input with the deployment's `defaults`, then the platform's, filled in."""
        ...


def create(
    ctx: AppContext,
    token: str,
    name: str,
    job_input: CallInput,
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
                    tracing.GEN_AI_MAX_TOKENS: resolved.max_tokens,
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
                claims.announce(ctx.celery, ctx.sessions, handed.job, handed.worker_id, now)
                families.job_handed_off(handed.job)
    return public, tenant_id


def _decide(
    ctx: AppContext,
    session: Session,
    view: EdgeView,
    token: str,
    name: str,
    job_input: CallInput,
    webhook: str | None,
    idempotency_key: str | None,
) -> tuple[Principal, DeploymentRef, JobInput, Job | None]:
    """Whether the call is admitted, charged to its tenant's quota: (caller, deployment, input
    with the deployment's defaults, the job an earlier call with `idempotency_key` created).
    Reads only; the charge is the last step (the quota script runs while the earlier call is
    looked up and the tenant's jobs are counted), and a replay is given its charge back. On a
    view not `fresh`, StaleView when its generation moved (nothing charged)."""
    who = view.principal(session, token)
    who.require("run")
    dep = view.deployment(session, who.tenant_id, name)
    if webhook:
        targets.check_target(webhook, ctx.settings.webhook_allow_private)
    resolved = job_input.resolved(dep.spec.defaults)
    prompt_tokens = check_fits_context(ctx, dep, resolved)
    tokens = prompt_tokens + resolved.n * resolved.max_tokens  # every choice may run to max
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


def check_fits_context(ctx: AppContext, dep: DeploymentRef, resolved: JobInput) -> int:
    """Refuse a prompt that cannot fit the model's context, before anything is written.

    Returns the prompt's token count (an estimate when the model files are unreadable).
    """
    meta = ctx.model_meta.get(dep.id, dep.version, dep.tenant_id, dep.spec.model)
    if meta is None:
        # Metadata unreadable: the worker checks and reports; ~4 characters per token.
        return len(resolved.prompt) // 4 + 1
    _check_token_ids(resolved, meta.vocab_size)
    prompt_tokens = meta.count_prompt_tokens(resolved.prompt, resolved.add_special_tokens)
    max_tokens = resolved.max_tokens
    if prompt_tokens + max_tokens > meta.max_context:
        raise ContextTooLong(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"context of {meta.max_context} tokens",
            errors=[{"field": "input.prompt", "message": "too long for the context"}],
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            limit=meta.max_context,
        )
    return prompt_tokens


def _check_token_ids(resolved: JobInput, vocab_size: int) -> None:
    """Token ids a call names exist in the model's vocabulary (else the worker would refuse the
    job after it was admitted and queued)."""
    named = {
        "logit_bias": [token for token, _ in resolved.logit_bias],
        "stop_token_ids": list(resolved.stop_token_ids),
    }
    for name, ids in named.items():
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequest(
                f"{name}: token id {bad[0]} is not in the model's vocabulary [0, {vocab_size})",
                errors=[{"field": f"input.{name}", "message": "unknown token id"}],
                param=name,
            )


def request_hash(name: str, body: dict[str, Any]) -> str:
    """What an Idempotency-Key is bound to: the deployment and the request body."""
    return hashlib.sha256(json.dumps({"name": name, **body}, sort_keys=True).encode()).hexdigest()

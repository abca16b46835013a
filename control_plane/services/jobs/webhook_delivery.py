"""Webhook delivery: one attempt (load, sign, check, send, log), retry timing, `job.output`.

The Celery tasks (`control_plane/tasks.py`) are thin: they call `deliver` or `follow_step` and
schedule what these return. Every attempt leaves a `webhook_deliveries` row (never the body).

    deliver      job.starting | job.started | job.output | job.completed | batch.completed,
                 one attempt
                 → delay before the next attempt, or None (delivered, permanent failure, over)
    follow_step  one look at a running job's event stream → maybe a `job.output` message id,
                 and whether to look again after `webhook_output_interval_s`

Statuses: a job's (or batch's) `webhook_status` follows its `*.completed` message: pending →
delivered | failed. A 410 from the receiver fails it at once and, when the URL belongs to one of
the tenant's endpoints, disables that endpoint (later messages to it are not sent).
`job.output` and `job.starting` are best effort: not retried, as the next one (and the job
itself) says more.
"""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx
import redis
from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from common import logs, tracing
from common.protocol import JOB_EVENTS_TTL_S, TERMINAL_EVENTS, EventType, job_events_key
from control_plane.db.models import Batch, Job, WebhookDelivery, WebhookEndpoint
from control_plane.domain.clock import iso
from control_plane.domain.states import TERMINAL
from control_plane.domain.webhook_resend import MAX_JITTER
from control_plane.metrics import families
from control_plane.services.jobs import batches, cold_starts, job_store
from control_plane.services.webhooks import endpoints, signing, targets
from control_plane.services.webhooks.signing import DeliveryResult
from control_plane.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# Span attributes of `webhook.deliver` (docs/observability.md "Traces").
EVENT = "platform.webhook.event"
ATTEMPT = "platform.webhook.attempt"
MESSAGE_ID = "platform.webhook.id"  # the `webhook-id` the receiver sees
OUTCOME = "platform.webhook.outcome"  # delivered | retrying | failed

OUTPUT_EVENT = "job.output"
STARTING_EVENT = "job.starting"
# Sent once, never retried: the next one (or the job itself) says more than a late copy would.
BEST_EFFORT = frozenset({OUTPUT_EVENT, STARTING_EVENT})


@dataclass(frozen=True, slots=True)
class DeliveryEnv:
    settings: Settings  # retry schedule, SSRF policy
    sessions: sessionmaker[Session]  # SQL session factory
    http: httpx.Client  # sender (no redirects, bounded timeout)
    redis: redis.Redis  # job event streams (text so far of `job.output`)


@dataclass(frozen=True, slots=True)
class Message:
    event_type: str  # job.started | job.output | job.completed | batch.completed
    msg_id: str  # Standard Webhooks `webhook-id`: the same for every attempt of one event
    attempt: int  # 1 for the first attempt
    job_id: str | None = None  # subject: a job ...
    batch_id: str | None = None  # ... or a batch


@dataclass(frozen=True, slots=True)
class _Prepared:
    url: str  # target
    secrets: list[str]  # signing secrets, newest first
    data: dict[str, Any]  # the `data` member of the payload
    endpoint_id: str | None  # matching endpoint of the tenant, if any
    refusal: DeliveryResult | None  # set when the message must not be sent (endpoint disabled)
    traceparent: str | None = None  # the job's trace (None: a batch, or not traced)


def retry_delay_s(attempt: int, schedule: tuple[float, ...], rng: random.Random) -> float | None:
    """Delay before attempt `attempt + 1`, with up to 25% jitter; None when retries are over."""
    if attempt > len(schedule):
        return None
    base = schedule[attempt - 1]
    return base * (1 + MAX_JITTER * rng.random())


def deliver(env: DeliveryEnv, msg: Message, now: datetime, rng: random.Random) -> float | None:
    """One attempt at `msg`; returns the delay before the next attempt (None: no more)."""
    with env.sessions() as session:
        prepared = _prepare(session, env, msg, now)
    if prepared is None:
        return None
    with _traced(msg, prepared) as span:
        logs.bind(**tracing.ids_of(span))  # the task's later lines name the attempt's span
        result = prepared.refusal or _send(env, prepared, msg, now)
        retry = not (result.ok or result.permanent or msg.event_type in BEST_EFFORT)
        delay = (
            retry_delay_s(msg.attempt, env.settings.webhook_retry_schedule_s, rng)
            if retry
            else None
        )
        if span is not None:
            span.set_attribute(OUTCOME, outcome(result.ok, delay))
            if result.status_code is not None:
                span.set_attribute("http.response.status_code", result.status_code)
            if not result.ok:  # a status, or no answer at all (refused, reset, timed out)
                tracing.failed(span, str(result.status_code or "no_response"))
    with env.sessions() as session:
        _record(session, msg, prepared, result, delay, now)
        session.commit()
    families.webhook_attempt(msg.event_type, outcome(result.ok, delay))
    return delay


def _traced(msg: Message, p: _Prepared) -> contextlib.AbstractContextManager[Span | None]:
    """`webhook.deliver`, one attempt, in its job's trace (a client span: the receiver's own
    tracing may continue it); nothing for an untraced job or a batch. Never the URL: it may
    carry the receiver's token."""
    if p.traceparent is None or not tracing.enabled():
        return contextlib.nullcontext()
    return tracing.span(
        "webhook.deliver",
        parent=tracing.context_of(p.traceparent),
        kind="client",
        attributes={
            tracing.JOB_ID: msg.job_id,
            EVENT: msg.event_type,
            ATTEMPT: msg.attempt,
            MESSAGE_ID: msg.msg_id,
        },
    )


def outcome(ok: bool, delay: float | None) -> str:
    """How an attempt went, for `platform_webhook_deliveries_total`."""
    return "delivered" if ok else "retrying" if delay is not None else "failed"


def _prepare(session: Session, env: DeliveryEnv, msg: Message, now: datetime) -> _Prepared | None:
    subject = (
        WebhookDelivery.job_id == msg.job_id
        if msg.job_id is not None
        else WebhookDelivery.batch_id == msg.batch_id
    )
    seen = session.scalar(
        select(WebhookDelivery.id)
        .where(
            subject,  # indexed for jobs: the log is never scanned whole
            WebhookDelivery.msg_id == msg.msg_id,
            or_(WebhookDelivery.delivered.is_(True), WebhookDelivery.attempt == msg.attempt),
        )
        .limit(1)
    )
    if seen is not None:  # delivered already, or a repeated task message of this attempt
        return None
    data: dict[str, Any]
    traceparent = None
    if msg.job_id is not None:
        job = session.get(Job, msg.job_id)
        if job is None or not job.webhook_url:
            return None
        tenant_id, url, data = job.tenant_id, job.webhook_url, job_store.to_public(job)
        traceparent = job.traceparent
        if msg.event_type == OUTPUT_EVENT:
            text = read_progress(env.redis, job.id, job.attempt).text
            data["output"] = {"text": text, "finish_reason": None}
        elif msg.event_type == STARTING_EVENT:
            # the cold start as it stands when sent (None: over by then)
            data["cold_start"] = cold_starts.read(env.redis, job.deployment_id, now.timestamp())
    elif msg.batch_id is not None:
        batch = session.get(Batch, msg.batch_id)
        if batch is None or not batch.webhook_url:
            return None
        tenant_id, url, data = batch.tenant_id, batch.webhook_url, batches.to_public(session, batch)
    else:
        return None
    secrets, ep = endpoints.signing_secrets(session, tenant_id, url, now)
    refusal = None
    if ep is not None and ep.disabled_at is not None:
        refusal = DeliveryResult(
            None,
            f"not sent: endpoint {ep.id} is disabled ({ep.disabled_reason})",
            ok=False,
            gone=False,
            permanent=True,
        )
    return _Prepared(url, secrets, data, ep.id if ep else None, refusal, traceparent)


def _send(env: DeliveryEnv, p: _Prepared, msg: Message, now: datetime) -> DeliveryResult:
    # NOTE: checked again at delivery time: the host may resolve elsewhere than when accepted.
    problem = targets.target_problem(p.url, env.settings.webhook_allow_private)
    if problem is not None:
        return DeliveryResult(
            None, f"not sent: {problem.reason}", ok=False, gone=False, permanent=problem.permanent
        )
    timestamp = int(now.timestamp())
    body = signing.payload(msg.event_type, timestamp, p.data)
    return signing.send_once(env.http, p.url, p.secrets, msg.msg_id, timestamp, body)


def _record(
    session: Session,
    msg: Message,
    p: _Prepared,
    result: DeliveryResult,
    delay: float | None,
    now: datetime,
) -> None:
    session.add(
        WebhookDelivery(
            job_id=msg.job_id,
            batch_id=msg.batch_id,
            url=p.url,
            msg_id=msg.msg_id,
            event_type=msg.event_type,
            attempt=msg.attempt,
            status_code=result.status_code,
            error=result.error,
            delivered=result.ok,
            created_at=now,
        )
    )
    if result.gone and p.endpoint_id is not None:
        ep = session.get(WebhookEndpoint, p.endpoint_id)
        if ep is not None:
            endpoints.disable(ep, "the receiver answered 410 Gone", now)
    subject: Job | Batch | None = (
        session.get(Job, msg.job_id) if msg.job_id else session.get(Batch, msg.batch_id)
    )
    if subject is None:
        return
    if result.gone:
        subject.webhook_status = "failed"
    elif msg.event_type.endswith(".completed"):
        if result.ok:
            subject.webhook_status = "delivered"
        elif delay is None:
            subject.webhook_status = "failed"


def deliveries(
    session: Session, *, job_id: str | None = None, batch_id: str | None = None
) -> list[WebhookDelivery]:
    q = select(WebhookDelivery)
    q = q.where(
        WebhookDelivery.job_id == job_id if job_id else WebhookDelivery.batch_id == batch_id
    )
    return list(session.scalars(q.order_by(WebhookDelivery.id)))


def delivery_public(d: WebhookDelivery) -> dict[str, Any]:
    """One log entry; the body is never stored nor shown."""
    return {
        "msg_id": d.msg_id,
        "event_type": d.event_type,
        "attempt": d.attempt,
        "url": d.url,
        "status_code": d.status_code,
        "error": d.error,
        "delivered": d.delivered,
        "created_at": iso(d.created_at),
    }


# --- job.output ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    text: str  # the output text so far (concatenated deltas)
    last_output_id: str | None  # stream id of the newest output delta
    terminal: bool  # a terminal event is in the stream


def read_progress(r: redis.Redis, job_id: str, attempt: int) -> Progress:
    """Read a job's event stream from the start: the text of `attempt` (a job run again after
    its worker died has the deltas of each attempt in its stream; a delta that does not name
    its attempt counts)."""
    parts: list[str] = []
    last_id: str | None = None
    terminal = False
    entries: Any = r.xrange(job_events_key(job_id))
    for entry_id, fields in entries:
        event = _text(fields[b"type"])
        if event == EventType.OUTPUT:
            data = json.loads(_text(fields[b"data"]))
            if data.get("attempt", attempt) != attempt:
                continue
            parts.append(str(data.get("delta", "")))
            last_id = _text(entry_id)
        elif event in TERMINAL_EVENTS:
            terminal = True
    return Progress("".join(parts), last_id, terminal)


@dataclass(frozen=True, slots=True)
class FollowStep:
    msg_id: str | None  # a `job.output` message to send now, if there is new text
    sent_id: str | None  # stream id of the newest delta sent so far
    again: bool  # look again after webhook_output_interval_s


def follow_step(
    env: DeliveryEnv, job_id: str, attempt: int, seq: int, sent_id: str | None
) -> FollowStep:
    """One look at a running job's stream; `seq` counts the looks of this follower."""
    stop = FollowStep(None, sent_id, again=False)
    if seq == 0 and not _claim_follower(env.redis, job_id, attempt):
        return stop  # another follower of this attempt runs already
    with env.sessions() as session:
        job = session.get(Job, job_id)
        if (
            job is None
            or job.attempt != attempt
            or job.status in TERMINAL
            or not job.webhook_url
            or "output" not in (job.webhook_events or [])
        ):
            return stop
    progress = read_progress(env.redis, job_id, attempt)
    if progress.terminal:
        return stop  # job.completed carries the final text
    if progress.last_output_id is None or progress.last_output_id == sent_id:
        return FollowStep(None, sent_id, again=True)
    msg_id = signing.message_id(job_id, "output", attempt, seq)
    return FollowStep(msg_id, progress.last_output_id, again=True)


def _claim_follower(r: redis.Redis, job_id: str, attempt: int) -> bool:
    """True for the first follower of this attempt.

    NOTE: the mutex is a consumer group on the job's own stream (XGROUP CREATE is atomic and
    fails with BUSYGROUP when it exists), so it needs no key of its own and expires with the
    stream.
    """
    key = job_events_key(job_id)
    try:
        r.xgroup_create(key, f"webhook-output-{attempt}", id="$", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return False
        raise
    r.expire(key, JOB_EVENTS_TTL_S)
    return True


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

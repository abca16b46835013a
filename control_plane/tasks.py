"""Celery worker entry point for the control plane's background tasks (webhook delivery).

Run: `celery -A control_plane.tasks worker -Q platform.control`. Like a web view, a task
deserialises, checks idempotency, and calls service code.
"""

from __future__ import annotations

import logging
import random
import time

import httpx
from sqlalchemy import select

from control_plane.db.models import Job, Tenant, WebhookDelivery
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.errors import InvalidRequest
from control_plane.services import jobs, webhooks
from control_plane.services.dispatch import make_celery
from control_plane.settings import Settings
from control_plane.tasks_api import CONTROL_QUEUE, DELIVER_WEBHOOK_TASK

log = logging.getLogger(__name__)

settings = Settings()
app = make_celery(settings)
_sessions = make_sessionmaker(make_engine(settings.database_url))
_http = httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False)


def retry_delay_s(attempt: int, schedule: tuple[float, ...], rng: random.Random) -> float | None:
    """Delay before attempt `attempt + 1`, with up to 25% jitter; None when retries are over."""
    if attempt > len(schedule):
        return None
    base = schedule[attempt - 1]
    return base * (1 + 0.25 * rng.random())


@app.task(name=DELIVER_WEBHOOK_TASK, acks_late=True, reject_on_worker_lost=True)  # type: ignore[untyped-decorator]
def deliver_webhook(job_id: str, event_type: str, msg_id: str, attempt: int) -> None:
    with _sessions() as session:
        job = session.get(Job, job_id)
        if job is None or not job.webhook_url:
            return
        done = session.scalar(
            select(WebhookDelivery.id).where(
                WebhookDelivery.msg_id == msg_id, WebhookDelivery.delivered.is_(True)
            )
        )
        if done is not None:  # a redelivered task message: already sent
            return
        tenant = session.get(Tenant, job.tenant_id)
        assert tenant is not None
        url, secret, data = job.webhook_url, tenant.webhook_secret, jobs.to_public(job)

    try:
        webhooks.check_target(url, settings.webhook_allow_private)
        timestamp = int(time.time())
        body = webhooks.payload(event_type, timestamp, data)
        result = webhooks.send_once(_http, url, secret, msg_id, timestamp, body)
    except InvalidRequest as exc:
        result = webhooks.DeliveryResult(None, str(exc), ok=False, gone=True)

    delay = (
        None
        if result.ok or result.gone
        else retry_delay_s(attempt, settings.webhook_retry_schedule_s, random.Random())
    )
    with _sessions() as session:
        session.add(
            WebhookDelivery(
                job_id=job_id,
                msg_id=msg_id,
                event_type=event_type,
                attempt=attempt,
                status_code=result.status_code,
                error=result.error,
                delivered=result.ok,
            )
        )
        job = session.get(Job, job_id)
        if job is not None and event_type == "job.completed":
            if result.ok:
                job.webhook_status = "delivered"
            elif delay is None:
                job.webhook_status = "failed"
        session.commit()
    log.info(
        "webhook %s for job %s attempt %d: %s",
        event_type,
        job_id,
        attempt,
        result.status_code or result.error,
    )
    if delay is not None:
        app.send_task(
            DELIVER_WEBHOOK_TASK,
            kwargs={
                "job_id": job_id,
                "event_type": event_type,
                "msg_id": msg_id,
                "attempt": attempt + 1,
            },
            queue=CONTROL_QUEUE,
            countdown=delay,
        )

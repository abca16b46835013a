"""Celery worker entry point for the control plane's background tasks (webhooks).

Run: `celery -A control_plane.tasks worker -Q platform.control`. Like a web view, a task
deserialises, checks idempotency, and calls service code (`services/jobs/webhook_delivery.py`).

NOTE: a retry hours away is not one Celery countdown: the Redis transport redelivers messages
held unacknowledged longer than its visibility timeout (1 h by default), which would fork the
retry chain. A long wait hops instead: the message re-sends itself every MAX_COUNTDOWN_S until
its `not_before` time.
"""

from __future__ import annotations

import logging
import random
import time
from contextvars import Token
from datetime import UTC, datetime
from typing import Any

import httpx
import redis
from celery import signals

from common import logs, tracing
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.metrics import server
from control_plane.services.jobs import webhook_delivery
from control_plane.services.jobs.dispatch import make_celery
from control_plane.services.jobs.webhook_delivery import DeliveryEnv, Message
from control_plane.settings import Settings
from control_plane.tasks_api import (
    CONTROL_QUEUE,
    DELIVER_WEBHOOK_TASK,
    FOLLOW_OUTPUT_TASK,
    enqueue_webhook,
)

log = logging.getLogger(__name__)
# Longest single countdown; well under the broker's visibility timeout.
MAX_COUNTDOWN_S = 600.0

settings = Settings()
app = make_celery(settings)
_env = DeliveryEnv(
    settings=settings,
    sessions=make_sessionmaker(make_engine(settings.database_url)),
    http=httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False),
    redis=redis.Redis.from_url(settings.redis_url),
)


# --- logs: ours, not Celery's (docs/observability.md "Logs") ---
# NOTE: Celery's own lines name a task and its id, never its arguments (`extra` fields other
# than common.logs.FIELDS are dropped), and these tasks return None, so its "succeeded" lines
# print nothing of a tenant's either.


def _setup_logging(**_: Any) -> None:
    """Connected, this replaces Celery's logging setup (its `-l` is ignored: PLATFORM_LOG_*)."""
    logs.configure("celery", settings)


def _on_worker_init(instance: Any, **_: Any) -> None:
    """Configure logging before the worker's first warnings (running as root, say), which come
    before `setup_logging`; and drop Celery's start-up banner, the one thing it prints outside
    logging, in JSON the only lines that would not be JSON."""
    logs.configure("celery", settings)
    # webhook attempts join their job's trace (a threads pool: the exporter's thread is ours)
    tracing.configure("celery", settings)
    # its own /metrics (webhook deliveries) when its pod or container is not the API's; a
    # daemon thread of this process, which the threads pool never forks
    server.serve_from(settings)
    if settings.log_format == "json":
        instance.quiet = True


# task id → the token of the log context of the task running it (the pool's thread)
_task_ids: dict[str, Token[dict[str, Any] | None]] = {}


def _bind_ids(task_id: str, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    kwargs = kwargs or {}
    _task_ids[task_id] = logs.enter_context(
        job_id=kwargs.get("job_id"), batch_id=kwargs.get("batch_id")
    )


def _unbind_ids(task_id: str, **_: Any) -> None:
    token = _task_ids.pop(task_id, None)
    if token is not None:
        logs.exit_context(token)


signals.setup_logging.connect(_setup_logging)
signals.celeryd_init.connect(_on_worker_init)
signals.task_prerun.connect(_bind_ids)
signals.task_postrun.connect(_unbind_ids)


def _send_later(kwargs: dict[str, Any], delay_s: float) -> None:
    """Run DELIVER_WEBHOOK_TASK with `kwargs` after `delay_s` (hopping when it is long)."""
    app.send_task(
        DELIVER_WEBHOOK_TASK,
        kwargs={**kwargs, "not_before": time.time() + delay_s},
        queue=CONTROL_QUEUE,
        countdown=min(delay_s, MAX_COUNTDOWN_S),
    )


@app.task(name=DELIVER_WEBHOOK_TASK, acks_late=True, reject_on_worker_lost=True)  # type: ignore[untyped-decorator]
def deliver_webhook(
    event_type: str,
    msg_id: str,
    attempt: int,
    job_id: str | None = None,
    batch_id: str | None = None,
    not_before: float | None = None,
) -> None:
    kwargs = {
        "event_type": event_type,
        "msg_id": msg_id,
        "attempt": attempt,
        "job_id": job_id,
        "batch_id": batch_id,
    }
    if not_before is not None and not_before - time.time() > 0.05:
        _send_later(kwargs, not_before - time.time())  # one more hop
        return
    msg = Message(event_type, msg_id, attempt, job_id=job_id, batch_id=batch_id)
    delay = webhook_delivery.deliver(_env, msg, datetime.now(UTC), random.Random())
    log.info(
        "webhook %s %s of %s attempt %d: %s",
        event_type,
        msg_id,
        job_id or batch_id,
        attempt,
        f"retry in {delay:.1f}s" if delay is not None else "done",
        extra={"attempt": attempt},
    )
    if delay is not None:
        _send_later({**kwargs, "attempt": attempt + 1}, delay)


@app.task(name=FOLLOW_OUTPUT_TASK, acks_late=True, reject_on_worker_lost=True)  # type: ignore[untyped-decorator]
def follow_job_output(job_id: str, attempt: int, seq: int, sent_id: str | None) -> None:
    step = webhook_delivery.follow_step(_env, job_id, attempt, seq, sent_id)
    if step.msg_id is not None:
        enqueue_webhook(app, job_id, webhook_delivery.OUTPUT_EVENT, step.msg_id)
    if step.again:
        app.send_task(
            FOLLOW_OUTPUT_TASK,
            kwargs={"job_id": job_id, "attempt": attempt, "seq": seq + 1, "sent_id": step.sent_id},
            queue=CONTROL_QUEUE,
            countdown=settings.webhook_output_interval_s,
        )

"""Send again the `*.completed` webhooks whose delivery chain was lost (a Celery worker or an
API killed at the wrong moment): the rule is `domain/webhook_resend.py`; the subjects are the
ended jobs and completed batches still `pending`, found through a partial index."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from common.protocol import webhook_resent_key
from control_plane.db.models import Batch, Job, WebhookDelivery
from control_plane.domain.states import TERMINAL
from control_plane.domain.webhook_resend import GRACE, Recorded, attempt_to_resend
from control_plane.reconcile.env import Env
from control_plane.services.webhooks import signing
from control_plane.tasks_api import enqueue_batch_webhook, enqueue_webhook

log = logging.getLogger(__name__)
# One resend per subject this often at most: while no Celery worker runs, every sweep would
# find the same chains lost again, and the queue would grow by all of them each time.
RESEND_EVERY_S = 300


def resend_lost(session: Session, env: Env, now: datetime) -> int:
    """Enqueue the next attempt of every lost chain; how many were sent again."""
    ended = func.coalesce(Job.completed_at, Job.created_at)
    jobs = session.execute(
        select(Job.id, ended).where(
            Job.webhook_status == "pending", Job.status.in_(TERMINAL), ended < now - GRACE
        )
    ).all()
    batches = session.execute(
        select(Batch.id, Batch.completed_at).where(
            Batch.webhook_status == "pending",
            Batch.completed_at.is_not(None),
            Batch.completed_at < now - GRACE,
        )
    ).all()
    sent = _resend(
        session, env, now, jobs, WebhookDelivery.job_id, "job.completed", enqueue_webhook
    )
    return sent + _resend(
        session,
        env,
        now,
        batches,
        WebhookDelivery.batch_id,
        "batch.completed",
        enqueue_batch_webhook,
    )


def _resend(
    session: Session,
    env: Env,
    now: datetime,
    subjects: Sequence[Any],
    subject: InstrumentedAttribute[str | None],
    event: str,
    enqueue: Callable[..., None],
) -> int:
    if not subjects:
        return 0
    latest = (
        select(func.max(WebhookDelivery.id))
        .where(subject.in_([s[0] for s in subjects]), WebhookDelivery.event_type == event)
        .group_by(subject)
    )
    last = {
        sid: Recorded(msg_id, attempt, at, delivered)
        for sid, msg_id, attempt, at, delivered in session.execute(
            select(
                subject,
                WebhookDelivery.msg_id,
                WebhookDelivery.attempt,
                WebhookDelivery.created_at,
                WebhookDelivery.delivered,
            ).where(WebhookDelivery.id.in_(latest))
        )
    }
    sent = 0
    for sid, ended_at in subjects:
        rec = last.get(sid)
        again = attempt_to_resend(now, ended_at, rec, env.settings.webhook_retry_schedule_s)
        if again is None:
            continue
        try:
            if not env.redis.set(webhook_resent_key(sid), again, nx=True, ex=RESEND_EVERY_S):
                continue  # sent again not long ago
        except redis.RedisError:
            return sent  # the broker is likely down too: the next sweep tries
        msg_id = rec.msg_id if rec is not None else signing.message_id(sid, "completed")
        enqueue(env.celery, sid, event, msg_id, again)
        ids = {"job_id": sid} if event.startswith("job.") else {"batch_id": sid}
        log.warning(
            "%s of %s: its delivery was lost; attempt %d sent again",
            event,
            sid,
            again,
            extra={**ids, "attempt": again},
        )
        sent += 1
    return sent

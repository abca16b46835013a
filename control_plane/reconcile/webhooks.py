"""Send again the `*.completed` webhooks whose delivery chain was lost (a Celery worker or an
API killed at the wrong moment): the rule is `domain/webhook_resend.py`; the subjects are the
ended jobs and completed batches still `pending`, found through a partial index."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from control_plane.db.models import Batch, Job, WebhookDelivery
from control_plane.domain.plans.webhooks import plan_resend
from control_plane.domain.states import TERMINAL
from control_plane.domain.webhook_resend import GRACE, Recorded
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.services.webhooks import signing

log = logging.getLogger(__name__)


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
    sent = _resend(session, env, now, jobs, WebhookDelivery.job_id, "job.completed")
    return sent + _resend(session, env, now, batches, WebhookDelivery.batch_id, "batch.completed")


def _resend(
    session: Session,
    env: Env,
    now: datetime,
    subjects: Sequence[Any],
    subject: InstrumentedAttribute[str | None],
    event: str,
) -> int:
    if not subjects:
        return 0
    latest = (
        select(func.max(WebhookDelivery.id))
        .where(subject.in_([s[0] for s in subjects]), WebhookDelivery.event_type == event)
        .group_by(subject)
    )
    last: dict[str, Recorded] = {
        str(sid): Recorded(msg_id, attempt, at, delivered)
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
    first = {sid: signing.message_id(sid, "completed") for sid, _ in subjects}
    schedule = env.settings.webhook_retry_schedule_s
    act = Actuator(session, env, now)
    # a RedisError: the broker is likely down too; the next sweep tries the rest
    with contextlib.suppress(redis.RedisError):
        act.apply(plan_resend(subjects, last, event, first, schedule, now))
    return act.resent

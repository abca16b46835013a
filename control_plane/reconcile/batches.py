"""The batch reconciler, every tick: top each running batch up to `max_in_flight` jobs in
flight (each dispatched line is an arrival for the autoscaler: `batch_slots.wake_dispatched`;
a line that ends hands its slot on at once, without waiting for a tick: `batch_slots.hand_over`);
once all its jobs are terminal, write the results JSONL to object storage, mark the batch
completed and send `batch.completed`.
"""

from __future__ import annotations

import logging
from datetime import datetime

import redis
from celery import Celery
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from common import logs
from control_plane.db.models import Batch, Job
from control_plane.domain.states import ACTIVE, PENDING
from control_plane.services.jobs import batch_slots
from control_plane.services.jobs.batches import (
    COMPLETED,
    RESULTS_CONTENT_TYPE,
    RUNNING,
    iter_results,
    results_uri,
)
from control_plane.services.storage import object_store
from control_plane.services.webhooks import signing
from control_plane.settings import Settings
from control_plane.tasks_api import enqueue_batch_webhook

log = logging.getLogger(__name__)


def pump(
    session: Session, celery: Celery, r: redis.Redis, now: datetime, *, settings: Settings
) -> None:
    """One tick of bounded fan-out and completion for every running batch.

    Called by the autoscaler loop; a failure in one batch (object storage down) is logged and
    retried on the next tick, never blocking the others.
    """
    ids = list(session.scalars(select(Batch.id).where(Batch.status == RUNNING)))
    for batch_id in ids:
        with logs.log_context(batch_id=batch_id):
            try:
                _pump_one(session, celery, r, now, settings, batch_id)
            except Exception:
                session.rollback()
                log.exception("batch %s: pump failed; retrying next tick", batch_id)


def _pump_one(
    session: Session,
    celery: Celery,
    r: redis.Redis,
    now: datetime,
    settings: Settings,
    batch_id: str,
) -> None:
    batch = session.get(Batch, batch_id)
    if batch is None or batch.status != RUNNING:
        return
    pending = [s.value for s in PENDING]
    rows = session.execute(
        select(Job.status, Job.dispatched_at.is_not(None), func.count())
        .where(Job.batch_id == batch_id, Job.status.in_([s.value for s in ACTIVE]))
        .group_by(Job.status, Job.dispatched_at.is_not(None))
    ).all()
    in_flight = sum(n for status, woken, n in rows if woken or status not in pending)
    waiting = sum(n for status, woken, n in rows if not woken and status in pending)
    if in_flight == 0 and waiting == 0:
        _complete(session, celery, now, settings, batch)
        return
    free = batch.max_in_flight - in_flight
    if free <= 0 or waiting == 0:
        return
    next_ids = batch_slots.dispatch_next(session, batch_id, free, now)
    # NOTE: committed before the wake-ups: a lost wake-up is re-sent by the reconciler, while a
    # wake-up for an uncommitted slot could exceed max_in_flight.
    session.commit()
    batch_slots.wake_dispatched(r, batch.deployment_id, next_ids, now)
    if next_ids:
        log.info("batch %s: dispatched %d more jobs", batch_id, len(next_ids))


def _complete(
    session: Session, celery: Celery, now: datetime, settings: Settings, batch: Batch
) -> None:
    uri = results_uri(settings, batch)
    data = b"".join(iter_results(session, batch.id, terminal_only=False))
    object_store.write(settings, uri, data, RESULTS_CONTENT_TYPE)
    res = session.execute(
        update(Batch)
        .where(Batch.id == batch.id, Batch.status == RUNNING)
        .values(status=COMPLETED, results_uri=uri, completed_at=now)
    )
    session.commit()
    if res.rowcount == 0:  # type: ignore[attr-defined]
        return  # canceled meanwhile, or another loop finished it
    log.info("batch %s: completed, %d results at %s", batch.id, batch.total, uri)
    if batch.webhook_url:
        try:
            enqueue_batch_webhook(
                celery, batch.id, "batch.completed", signing.message_id(batch.id, "completed")
            )
        except Exception:
            log.exception("batch %s: could not enqueue its webhook", batch.id)

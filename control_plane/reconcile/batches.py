"""The batch reconciler, every tick: each running batch's active lines counted, planned
(`domain/plans/batches.py`: top it up to `max_in_flight` lines in flight, or complete it once
every line ended) and applied, one batch at a time, so a batch that fails (object storage down)
is retried next tick without holding the others back.

Each dispatched line is an arrival for the autoscaler (`batch_slots.wake_dispatched`); a line
that ends hands its slot on at once, without waiting for a tick (`batch_slots.hand_over`).
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from common import logs
from control_plane.db.models import Batch, Job
from control_plane.domain.plans.batches import BatchLoad, plan_batch
from control_plane.domain.states import ACTIVE, PENDING
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.services.jobs.batches import RUNNING

log = logging.getLogger(__name__)


def pump(session: Session, env: Env, now: datetime) -> None:
    """One tick of bounded fan-out and completion for every running batch."""
    running = session.execute(
        select(Batch.id, Batch.deployment_id, Batch.max_in_flight).where(Batch.status == RUNNING)
    ).all()
    for batch_id, deployment_id, max_in_flight in running:
        with logs.log_context(batch_id=batch_id):
            try:
                load = _load(session, batch_id, deployment_id, max_in_flight)
                act = Actuator(session, env, now)
                act.apply(plan_batch(load))
                act.commit()
            except Exception:
                session.rollback()
                log.exception("batch %s: pump failed; retrying next tick", batch_id)


def _load(session: Session, batch_id: str, deployment_id: str, max_in_flight: int) -> BatchLoad:
    pending = [s.value for s in PENDING]
    rows = session.execute(
        select(Job.status, Job.dispatched_at.is_not(None), func.count())
        .where(Job.batch_id == batch_id, Job.status.in_([s.value for s in ACTIVE]))
        .group_by(Job.status, Job.dispatched_at.is_not(None))
    ).all()
    in_flight = sum(n for status, woken, n in rows if woken or status not in pending)
    waiting = sum(n for status, woken, n in rows if not woken and status in pending)
    return BatchLoad(batch_id, deployment_id, max_in_flight, in_flight, waiting)

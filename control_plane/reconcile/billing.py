"""The billing reconciler, every tick: no open segment grows past a minute (a crash loses at
most that much: `domain/plans/billing.py`), and each closed busy segment whose attempts have
all ended is split among them exactly (`domain.allocation.allocate`, pure; this step reads the
segments and attempts and writes its shares), so job costs + idle costs = worker cost.

Segments are written by `services/workers/billing.close_segment`, the one path for them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, or_, select, text
from sqlalchemy.orm import Session

from common.protocol import WorkerState
from control_plane.db.models import BILLING_UNALLOCATED, BillingRecord, CostAllocation, JobAttempt
from control_plane.domain.allocation import AttemptSpan, allocate
from control_plane.domain.plans.billing import OpenSegment, plan_rolls
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.services.workers import worker_records

# Attempts that ended through the platform's fault are not billed.
PLATFORM_FAULTS = frozenset({"worker_lost"})
# Busy segments split per tick at most (a backlog drains over the next ticks).
ALLOCATE_BATCH = 500


def roll_open_segments(session: Session, env: Env, now: datetime) -> None:
    """Close the open segment of every live worker that has been in one phase for a minute
    (`domain/plans/billing.py`)."""
    live = [
        OpenSegment(
            w.id,
            WorkerState(w.state),
            w.deployment_id is None,
            w.state_since,
            w.last_heartbeat_at,
        )
        for w in worker_records.live(session)
    ]
    Actuator(session, env, now).apply(plan_rolls(live, now))


def allocate_ready(session: Session, now: datetime) -> int:
    """Split closed busy segments whose attempts have all ended; returns how many were split.

    A tick's worth in four reads and two bulk writes: the segments waiting (a partial index),
    the attempts of their workers that ended after the worker's earliest of them began or
    still run, and the allocations already written. One query per segment, over all of its
    worker's attempts, held the reconciler's write transaction open for 20-150 ms under
    steady traffic (every short job closes a busy segment), and every API write waited.
    """
    records = list(
        session.scalars(
            select(BillingRecord)
            .where(text(BILLING_UNALLOCATED))
            .order_by(BillingRecord.id)
            .limit(ALLOCATE_BATCH)
        )
    )
    if not records:
        return 0
    since: dict[str, datetime] = {}
    for r in records:
        since[r.worker_id] = min(r.start, since.get(r.worker_id, r.start))
    by_worker = _attempts_since(session, since)
    written: set[tuple[int, str, int]] = {
        (rec_id, job_id, attempt)
        for rec_id, job_id, attempt in session.execute(
            select(
                CostAllocation.billing_record_id, CostAllocation.job_id, CostAllocation.attempt
            ).where(CostAllocation.billing_record_id.in_([r.id for r in records]))
        )
    }
    rows: list[dict[str, Any]] = []
    done = 0
    for rec in records:
        attempts = [
            a
            for a in by_worker.get(rec.worker_id, ())
            if a.started_at < rec.end and (a.ended_at is None or a.ended_at > rec.start)
        ]
        if any(a.ended_at is None for a in attempts):
            continue  # an attempt still runs: its tokens are not known yet
        spans = [
            AttemptSpan(
                job_id=a.job_id,
                attempt=a.attempt,
                start=a.started_at,
                end=a.ended_at or rec.end,
                tokens=(a.prompt_tokens or 0) + (a.generated_tokens or 0),
                billable=a.outcome not in PLATFORM_FAULTS,
            )
            for a in attempts
        ]
        rows.extend(
            {
                "billing_record_id": rec.id,
                "tenant_id": rec.tenant_id,
                "job_id": share.job_id,
                "attempt": share.attempt,
                "seconds": share.seconds,
                "amount": share.amount,
                "billable": share.billable,
            }
            for share in allocate(rec.start, rec.end, rec.amount, spans)
            if (rec.id, share.job_id, share.attempt) not in written
        )
        rec.allocated = True
        done += 1
    if rows:
        session.execute(insert(CostAllocation), rows)
    return done


def _attempts_since(session: Session, since: dict[str, datetime]) -> dict[str, list[JobAttempt]]:
    """worker id → its attempts that ended after `since[worker]` or have not ended: index
    ranges of ix_job_attempts_worker_ended, so a busy worker's older attempts are never read,
    and a worker whose segment waits for a long job costs the others nothing."""
    by_worker: dict[str, list[JobAttempt]] = defaultdict(list)
    ended_lately = or_(
        *(and_(JobAttempt.worker_id == w, JobAttempt.ended_at > t) for w, t in since.items())
    )
    running = and_(JobAttempt.worker_id.in_(since), JobAttempt.ended_at.is_(None))
    for which in (ended_lately, running):
        for a in session.scalars(select(JobAttempt).where(which)):
            by_worker[a.worker_id].append(a)
    return by_worker

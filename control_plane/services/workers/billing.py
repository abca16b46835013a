"""Billing records and job usage: writing segments, splitting busy time among jobs, reports.

    worker phase change ──► close_segment()  (boot/load capped at max_boot_s)
    loop, every tick    ──► roll_open_segments()  (no open segment grows past a minute)
                        ──► allocate_ready()      (busy amounts → job attempts, exactly)
    API                 ──► usage(), summary(), check()

Invariant: for every worker, sum(amount of its records) = sum(allocations of its busy
records) + amounts of its other phases. Duplicates are impossible by UNIQUE constraints.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from control_plane.db.models import (
    BILLING_UNALLOCATED,
    BillingRecord,
    CostAllocation,
    Deployment,
    Job,
    JobAttempt,
    Worker,
)
from control_plane.domain.allocation import AttemptSpan, allocate, billable_boot_seconds
from control_plane.domain.billing_math import AMOUNT_QUANTUM, segment_cost
from control_plane.domain.clock import iso
from control_plane.metrics import families, on_commit
from control_plane.services.paging import newest_first
from control_plane.settings import Settings

# No open segment grows past this: a crash loses at most this much, rebuilt from heartbeats.
MAX_SEGMENT_S = 60.0
BOOT_PHASES = ("boot", "load")
# The deployment name on warm-pool records (they have no deployment).
POOL_NAME = "(warm pool)"
# Attempts that ended through the platform's fault are not billed.
PLATFORM_FAULTS = frozenset({"worker_lost"})
# Busy segments split per tick at most (a backlog drains over the next ticks).
ALLOCATE_BATCH = 500


def close_segment(
    session: Session,
    settings: Settings,
    w: Worker,
    phase: str,
    start: datetime,
    end: datetime,
    note: str | None = None,
) -> None:
    """Write the record of one closed phase segment (at most once: UNIQUE(worker, start));
    a warm-pool worker's (no deployment) go to the platform's tenant as phase `pool`."""
    dep = session.get(Deployment, w.deployment_id) if w.deployment_id else None
    assert dep is not None or w.deployment_id is None
    rate = settings.rate_per_s(w.accelerator)
    wall = segment_cost(start, end, rate).seconds
    billed = wall
    if phase in BOOT_PHASES and dep is not None:
        used = exact_sum(
            session.scalars(
                select(BillingRecord.billed_seconds).where(
                    BillingRecord.worker_id == w.id, BillingRecord.phase.in_(BOOT_PHASES)
                )
            )
        )
        max_boot = Decimal(str(dep.spec.max_boot_s))
        billed = billable_boot_seconds(wall, used, max_boot)
        if billed < wall:
            note = note or "boot_cap"
    record = BillingRecord(
        tenant_id=w.tenant_id,
        worker_id=w.id,
        deployment_id=w.deployment_id,
        deployment_name=dep.name if dep else POOL_NAME,
        deployment_version=w.deployment_version,
        accelerator=w.accelerator,
        phase=phase,
        start=start,
        end=end,
        seconds=wall,
        billed_seconds=billed,
        rate_per_s=rate,
        amount=(billed * rate).quantize(AMOUNT_QUANTUM),
        note=note,
    )
    try:
        with session.begin_nested():
            session.add(record)
    except IntegrityError:
        return  # the same segment was already written (a replayed report)
    observe = functools.partial(families.billed, phase, w.accelerator, float(billed))
    on_commit.after_commit(session, observe)  # counted once the segment is committed


def roll_open_segments(session: Session, settings: Settings, now: datetime) -> None:
    """Close the open segment of every live worker that has been in one phase for a minute."""
    from control_plane.domain.billing_math import phase_of
    from control_plane.services.workers.worker_records import live

    for w in live(session):
        phase = phase_of(w.state, pooled=w.deployment_id is None)
        if phase is None or (now - w.state_since).total_seconds() < MAX_SEGMENT_S:
            continue
        # Only up to the last sign of life: a silent worker's time is not billed on trust.
        end = min(now, w.last_heartbeat_at or w.state_since)
        if end - w.state_since >= timedelta(seconds=MAX_SEGMENT_S / 2):
            close_segment(session, settings, w, phase, w.state_since, end, note="rolled")
            w.state_since = end


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


def job_costs(session: Session, job_ids: list[str]) -> dict[str, tuple[Decimal, Decimal]]:
    """job id → (billed seconds, cost) over its billable allocations."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(CostAllocation.job_id, CostAllocation.seconds, CostAllocation.amount).where(
            CostAllocation.job_id.in_(job_ids), CostAllocation.billable.is_(True)
        )
    ).all()
    out: dict[str, tuple[Decimal, Decimal]] = {}
    for job_id, seconds, amount in rows:
        s0, a0 = out.get(job_id, (Decimal(0), Decimal(0)))
        out[job_id] = (s0 + seconds, a0 + amount)
    return out


def usage_row(
    job: Job, attempts: list[JobAttempt], cost: tuple[Decimal, Decimal]
) -> dict[str, Any]:
    """Per-job usage: where its time went, its tokens, its cost share."""
    first = min((a.started_at for a in attempts), default=None)
    last = attempts[-1] if attempts else None
    queue_s = (first - job.created_at).total_seconds() if first else None
    execution_s = (
        (last.ended_at - last.started_at).total_seconds() if last and last.ended_at else None
    )
    return {
        "job_id": job.id,
        "deployment": job.deployment_name,
        "deployment_version": job.deployment_version,
        "api_key_id": job.api_key_id,
        "status": job.status,
        "created_at": iso(job.created_at),
        "queue_s": round(queue_s, 3) if queue_s is not None else None,
        # Waiting on a worker that booted for the job is part of its queue time.
        "boot_wait_s": (
            round(queue_s, 3) if queue_s is not None and attempts and attempts[0].boot_wait else 0.0
        ),
        "execution_s": round(execution_s, 3) if execution_s is not None else None,
        "billed_seconds": f"{cost[0]:f}",
        "prompt_tokens": job.prompt_tokens,
        "cached_tokens": last.cached_tokens if last else None,
        "generated_tokens": job.generated_tokens,
        "attempt": job.attempt,
        "workers": sorted({a.worker_id for a in attempts}),
        "cost": f"{cost[1].quantize(AMOUNT_QUANTUM):f}",
    }


def usage(
    session: Session,
    tenant_id: str,
    *,
    deployment: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    q = select(Job).where(Job.tenant_id == tenant_id)
    if deployment:
        q = q.where(Job.deployment_name == deployment)
    if since:
        q = q.where(Job.created_at >= since)
    if until:
        q = q.where(Job.created_at < until)
    page, next_cursor = newest_first(session, q, Job.id, limit, cursor)
    attempts: dict[str, list[JobAttempt]] = defaultdict(list)
    for a in session.scalars(
        select(JobAttempt)
        .where(JobAttempt.job_id.in_([j.id for j in page]))
        .order_by(JobAttempt.attempt)
    ):
        attempts[a.job_id].append(a)
    costs = job_costs(session, [j.id for j in page])
    zero = (Decimal(0), Decimal(0))
    rows = [usage_row(j, attempts[j.id], costs.get(j.id, zero)) for j in page]
    return rows, next_cursor


GROUPS = ("deployment", "day", "hour", "api_key", "phase")


def summary(
    session: Session, tenant_id: str, group_by: str, since: datetime | None, until: datetime | None
) -> list[dict[str, Any]]:
    """Cost and seconds grouped; api_key groups busy cost by the key that created each job
    (idle, boot and other phases have no key: group None)."""
    q = select(BillingRecord).where(BillingRecord.tenant_id == tenant_id)
    if since:
        q = q.where(BillingRecord.start >= since)
    if until:
        q = q.where(BillingRecord.start < until)
    totals: dict[str | None, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    records = list(session.scalars(q))
    if group_by == "api_key":
        busy_ids = [r.id for r in records if r.phase == "busy"]
        keyed = session.execute(
            select(Job.api_key_id, CostAllocation.seconds, CostAllocation.amount)
            .join(Job, Job.id == CostAllocation.job_id)
            .where(CostAllocation.billing_record_id.in_(busy_ids), CostAllocation.billable)
        ).all()
        for key, secs, amount in keyed:
            totals[key][0] += secs
            totals[key][1] += amount
        for r in records:
            if r.phase != "busy":
                totals[None][0] += r.billed_seconds
                totals[None][1] += r.amount
    else:
        for r in records:
            group = {
                "deployment": r.deployment_name,
                "day": r.start.strftime("%Y-%m-%d"),
                "hour": r.start.strftime("%Y-%m-%dT%H:00Z"),
                "phase": r.phase,
            }[group_by]
            totals[group][0] += r.billed_seconds
            totals[group][1] += r.amount
    return [
        {
            "group": g,
            "seconds": f"{s.quantize(Decimal('0.001')):f}",
            "amount": f"{a.quantize(AMOUNT_QUANTUM):f}",
        }
        for g, (s, a) in sorted(totals.items(), key=lambda kv: str(kv[0]))
    ]


def check(session: Session, tenant_id: str | None, now: datetime) -> list[dict[str, Any]]:
    """Drift between records, workers and jobs; [] when the books balance."""
    issues: list[dict[str, Any]] = []
    q = select(Worker)
    if tenant_id:
        q = q.where(Worker.tenant_id == tenant_id)
    for w in session.scalars(q):
        every = list(
            session.scalars(
                select(BillingRecord)
                .where(BillingRecord.worker_id == w.id)
                .order_by(BillingRecord.start)
            )
        )
        # A worker taken from the warm pool has the platform's records (phase `pool`) up to
        # its assignment, its tenant's from then on (= its started_at). A tenant sees its own.
        recs = [r for r in every if r.tenant_id == w.tenant_id]
        for a, b in itertools.pairwise(every if tenant_id is None else recs):
            if b.start != a.end:
                kind = "overlap" if b.start < a.end else "gap"
                issues.append({"worker_id": w.id, "issue": kind, "at": iso(a.end)})
        if w.stopped_at is not None and recs:
            covered = (recs[-1].end - recs[0].start).total_seconds()
            life = (w.stopped_at - w.started_at).total_seconds()
            if abs(covered - life) > 1.0:
                issues.append(
                    {
                        "worker_id": w.id,
                        "issue": "uncovered_lifetime",
                        "covered_s": round(covered, 3),
                        "lifetime_s": round(life, 3),
                    }
                )
        for r in recs:
            if r.phase != "busy" or not r.allocated:
                continue
            parts = list(
                session.scalars(
                    select(CostAllocation.amount).where(CostAllocation.billing_record_id == r.id)
                )
            )
            if parts and exact_sum(parts) != r.amount:
                issues.append({"worker_id": w.id, "issue": "allocation_mismatch", "record": r.id})
    stale = session.scalar(
        select(func.count()).where(
            BillingRecord.phase == "busy",
            BillingRecord.allocated.is_(False),
            BillingRecord.end < now - timedelta(hours=1),
            *([BillingRecord.tenant_id == tenant_id] if tenant_id else []),
        )
    )
    if stale:
        issues.append({"issue": "unallocated_busy_records", "count": int(stale)})
    return issues


def exact_sum(values: Iterable[Decimal | None]) -> Decimal:
    """Money and billed seconds are summed here, in Decimal: SQL's SUM over SQLite's text
    columns goes through floats, which made exact allocations look like drift."""
    return sum((v for v in values if v is not None), Decimal(0))

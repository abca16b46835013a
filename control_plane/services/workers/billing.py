"""Billing records and job usage: writing segments, splitting busy time among jobs, reports.

    worker phase change ──► close_segment()  (boot/load capped at max_boot_s)
    reconciler's tick   ──► reconcile/billing.py (open segments rolled, busy cost allocated)
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

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from control_plane.db.models import (
    BillingRecord,
    CostAllocation,
    Deployment,
    Job,
    JobAttempt,
    Worker,
)
from control_plane.domain.allocation import billable_boot_seconds
from control_plane.domain.billing_math import AMOUNT_QUANTUM, segment_cost
from control_plane.domain.clock import iso
from control_plane.metrics import families, on_commit
from control_plane.services.paging import newest_first
from control_plane.settings import Settings

BOOT_PHASES = ("boot", "load")
# The deployment name on warm-pool records (they have no deployment).
POOL_NAME = "(warm pool)"


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

"""One job's timeline for the console and `GET /v1/jobs/{id}/timeline`: where its time went
(queue, the boot / load / warm of the worker it waited on, each attempt's run) and its cost.

Read-only. Everything comes from rows the job's tenant owns: its job and attempts, and the
billing records and cost allocations billed to it, so a warm-pool worker's time before its
assignment (the platform's, phase `pool`) never appears, nor does any other tenant's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import BillingRecord, CostAllocation, Job, JobAttempt
from control_plane.domain.billing_math import AMOUNT_QUANTUM
from control_plane.domain.clock import iso

# The worker phases a job can wait through before its attempt starts (billing phase names).
WAIT_PHASES = ("boot", "load", "warm")


@dataclass(frozen=True, slots=True)
class Span:
    """One bar of the timeline."""

    phase: str  # queue | boot | load | warm | run
    start: datetime
    end: datetime | None  # None: still going at the time of the answer
    worker_id: str | None = None  # the worker of a boot/load/warm/run span
    attempt: int | None = None  # run spans: the attempt number (the fence)
    outcome: str | None = None  # run spans: how the attempt ended (None while it runs)
    # boot/load/warm: the worker's billed amount for the segment (the tenant pays it, it is
    # not part of the job's cost share); run: the job's share of the busy time of the attempt
    amount: Decimal | None = None
    billable: bool | None = None  # run spans: False for an attempt the platform lost (unbilled)


def spans(
    job: Job,
    attempts: list[JobAttempt],
    wait_records: list[BillingRecord],
    run_amounts: dict[int, tuple[Decimal, bool]],
) -> list[Span]:
    """The job's spans in time order. Pure: rows in, bars out.

    `wait_records`: billing records of the attempts' workers (boot / load / warm); only the
    part of each that overlaps the job's wait before that attempt is kept (a worker already
    warm when the job arrived contributes none). `run_amounts`: attempt → (its cost share,
    whether billed)."""
    out: list[Span] = []
    first_start = attempts[0].started_at if attempts else None
    out.append(Span("queue", job.created_at, first_start or job.completed_at))
    wait_from = job.created_at
    for a in attempts:
        out += waited_on(wait_records, a.worker_id, wait_from, a.started_at)
        amount, billable = run_amounts.get(a.attempt, (None, None))
        out.append(
            Span(
                "run",
                a.started_at,
                a.ended_at,
                worker_id=a.worker_id,
                attempt=a.attempt,
                outcome=a.outcome,
                amount=amount,
                billable=billable,
            )
        )
        wait_from = a.ended_at or a.started_at
    return sorted(out, key=lambda s: (s.start, s.phase != "queue"))


def waited_on(
    records: list[BillingRecord], worker_id: str, wait_from: datetime, wait_to: datetime
) -> list[Span]:
    """The parts of `worker_id`'s records (boot / load / warm) inside a job's wait from
    `wait_from` to `wait_to` (the attempt's start on that worker). Pure."""
    return [
        Span(
            r.phase,
            max(r.start, wait_from),
            min(r.end, wait_to),
            worker_id=r.worker_id,
            amount=r.amount,
        )
        for r in records
        if r.worker_id == worker_id and r.end > wait_from and r.start < wait_to
    ]


def wait_records(session: Session, tenant_id: str, worker_ids: list[str]) -> list[BillingRecord]:
    """The boot / load / warm records of `worker_ids` billed to `tenant_id`, oldest first (a
    warm-pool worker's time before its assignment is the platform's: never among them)."""
    if not worker_ids:
        return []
    return list(
        session.scalars(
            select(BillingRecord)
            .where(
                BillingRecord.tenant_id == tenant_id,
                BillingRecord.worker_id.in_(worker_ids),
                BillingRecord.phase.in_(WAIT_PHASES),
            )
            .order_by(BillingRecord.start)
        )
    )


def timeline(session: Session, job: Job, now: datetime) -> dict[str, Any]:
    """The public timeline of `job` (already checked to be the caller's)."""
    attempts = list(
        session.scalars(
            select(JobAttempt).where(JobAttempt.job_id == job.id).order_by(JobAttempt.attempt)
        )
    )
    records = wait_records(session, job.tenant_id, sorted({a.worker_id for a in attempts}))
    per_attempt: dict[int, list[Decimal]] = defaultdict(list)
    billed: dict[int, bool] = {}
    total_s, total_amount = Decimal(0), Decimal(0)
    for attempt, seconds, amount, billable in session.execute(
        select(
            CostAllocation.attempt,
            CostAllocation.seconds,
            CostAllocation.amount,
            CostAllocation.billable,
        ).where(CostAllocation.job_id == job.id, CostAllocation.tenant_id == job.tenant_id)
    ):
        per_attempt[attempt].append(amount if billable else Decimal(0))
        billed[attempt] = billed.get(attempt, False) or billable
        if billable:
            total_s += seconds
            total_amount += amount
    run_amounts = {a: (sum(v, Decimal(0)), billed[a]) for a, v in per_attempt.items()}
    return {
        "job_id": job.id,
        "deployment": job.deployment_name,
        "status": job.status,
        "status_reason": job.status_reason,
        "created_at": iso(job.created_at),
        "completed_at": iso(job.completed_at),
        "at": iso(now),
        "phases": [_public(s, now) for s in spans(job, attempts, records, run_amounts)],
        "cost": {
            "billed_seconds": f"{total_s:f}",
            "amount": f"{total_amount.quantize(AMOUNT_QUANTUM):f}",
            # busy time is shared among jobs once the worker's busy segment has closed
            "allocated": bool(per_attempt),
        },
    }


def _public(s: Span, now: datetime) -> dict[str, Any]:
    end = s.end or now
    return {
        "phase": s.phase,
        "start": iso(s.start),
        "end": iso(s.end),
        "seconds": round(max((end - s.start).total_seconds(), 0.0), 3),
        "worker_id": s.worker_id,
        "attempt": s.attempt,
        "outcome": s.outcome,
        "amount": None if s.amount is None else f"{s.amount.quantize(AMOUNT_QUANTUM):f}",
        "billable": s.billable,
    }

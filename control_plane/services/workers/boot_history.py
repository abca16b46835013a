"""What a deployment version's recent workers say about booting it: the crash-loop history
(the newest workers that failed before serving) and the measured start-up times (boot, load,
warm) the autoscaler and the cold-start ETAs use.
"""

from __future__ import annotations

import statistics
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from common.protocol import WorkerState
from control_plane.db.models import BillingRecord, Worker
from control_plane.domain import fleet
from control_plane.domain.crash_loop import BootHistory, PastWorker, history_of


def boot_history(session: Session, deployment_id: str, version: int) -> BootHistory:
    """The crash-loop history of a deployment version (its newest workers)."""
    rows = session.scalars(
        select(Worker)
        .where(Worker.deployment_id == deployment_id, Worker.deployment_version == version)
        .order_by(Worker.started_at.desc())
        .limit(10)
    )
    past = []
    for w in rows:
        failed = w.state == WorkerState.FAILED
        # Only failed workers need the billing lookup; history_of stops at the first other one.
        past.append(PastWorker(failed, failed and _served(session, w.id), w.stopped_at, w.reason))
        if not failed:
            break
    return history_of(past)


def _served(session: Session, worker_id: str) -> bool:
    return (
        session.scalar(
            select(BillingRecord.id)
            .where(BillingRecord.worker_id == worker_id, BillingRecord.phase.in_(["idle", "busy"]))
            .limit(1)
        )
        is not None
    )


# Boots of this many of a version's newest workers that became ready give its boot time.
BOOTS_MEASURED = 10


def _recently_ready(
    session: Session, deployment_id: str, version: int
) -> list[tuple[str, datetime, datetime]]:
    """(id, started, ready) of the version's newest workers that became ready (at most
    BOOTS_MEASURED). Ready = the start of its first idle or busy phase (a billing record), or,
    for a worker still in its first idle or busy phase, that phase's start."""
    newest = list(
        session.execute(
            select(Worker.id, Worker.started_at, Worker.state, Worker.state_since)
            .where(Worker.deployment_id == deployment_id, Worker.deployment_version == version)
            .order_by(Worker.started_at.desc())
            .limit(4 * BOOTS_MEASURED)  # failed boots among them are skipped
        )
    )
    if not newest:
        return []
    ready_at: dict[str, datetime] = dict(
        session.execute(
            select(BillingRecord.worker_id, func.min(BillingRecord.start))
            .where(
                BillingRecord.worker_id.in_([row.id for row in newest]),
                BillingRecord.phase.in_(["idle", "busy"]),
            )
            .group_by(BillingRecord.worker_id)
        ).all()
    )
    ready = []
    for row in newest:
        at = ready_at.get(row.id) or (row.state_since if row.state in fleet.READY_STATES else None)
        if at is not None:
            ready.append((row.id, row.started_at, at))
        if len(ready) == BOOTS_MEASURED:
            break
    return ready


def recent_boot_s(session: Session, deployment_id: str, version: int) -> float | None:
    """Median start → ready seconds (boot + load + warm) of the version's newest workers that
    became ready; None when none did yet."""
    boots = [
        max((ready - started).total_seconds(), 0.0)
        for _, started, ready in _recently_ready(session, deployment_id, version)
    ]
    return statistics.median(boots) if boots else None


STARTUP_PHASES = ("boot", "load", "warm")


def recent_phase_s(session: Session, deployment_id: str, version: int) -> dict[str, float]:
    """Median seconds of each start-up phase (boot, load, warm: billing phases) over the
    version's newest workers that became ready; a phase none of them went through is absent."""
    ids = [worker_id for worker_id, _, _ in _recently_ready(session, deployment_id, version)]
    if not ids:
        return {}
    per_worker: dict[tuple[str, str], float] = {}
    # A phase may span several records (open segments are rolled): add them up per worker.
    for worker_id, phase, seconds in session.execute(
        select(BillingRecord.worker_id, BillingRecord.phase, BillingRecord.seconds).where(
            BillingRecord.worker_id.in_(ids), BillingRecord.phase.in_(STARTUP_PHASES)
        )
    ):
        key = (worker_id, phase)
        per_worker[key] = per_worker.get(key, 0.0) + float(seconds)
    return {
        phase: statistics.median(values)
        for phase in STARTUP_PHASES
        if (values := [v for (_, p), v in per_worker.items() if p == phase])
    }

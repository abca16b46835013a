"""A job's timeline from its rows (services/jobs/timeline.spans, pure): which parts of its workers'
boot / load / warm were its wait, and one run per attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from control_plane.db.models import BillingRecord, Job, JobAttempt
from control_plane.services.jobs.timeline import spans

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def job(created: float = 0.0, completed: float | None = None) -> Job:
    done = at(completed) if completed is not None else None
    return Job(id="job_1", created_at=at(created), completed_at=done)


def attempt(
    n: int, worker: str, start: float, end: float | None, outcome: str | None
) -> JobAttempt:
    return JobAttempt(
        attempt=n,
        worker_id=worker,
        started_at=at(start),
        ended_at=at(end) if end is not None else None,
        outcome=outcome,
    )


def record(worker: str, phase: str, start: float, end: float) -> BillingRecord:
    return BillingRecord(
        worker_id=worker, phase=phase, start=at(start), end=at(end), amount=Decimal("0.000001")
    )


def test_a_job_that_waits_on_a_boot_sees_the_overlap_only() -> None:
    # the worker booted before the job came (another job's cold start) and loaded after
    rows = [record("w1", "boot", -2, 1), record("w1", "load", 1, 3), record("w1", "warm", 3, 4)]
    out = spans(job(completed=6), [attempt(1, "w1", 4.5, 6, "succeeded")], rows, {})
    assert [(s.phase, s.start, s.end) for s in out] == [
        ("queue", at(0), at(4.5)),
        ("boot", at(0), at(1)),  # clipped to the job's wait
        ("load", at(1), at(3)),
        ("warm", at(3), at(4)),
        ("run", at(4.5), at(6)),
    ]


def test_a_warm_worker_adds_nothing_and_a_retry_waits_from_the_lost_attempt() -> None:
    rows = [
        record("w1", "boot", -10, -8),  # long before the job: not its wait
        record("w2", "boot", 2, 4),  # booted after w1 died, while the job waited again
        record("w2", "load", 4, 5),
    ]
    attempts = [attempt(1, "w1", 1, 2, "worker_lost"), attempt(2, "w2", 5, 7, "succeeded")]
    shares = {1: (Decimal(0), False), 2: (Decimal("0.5"), True)}
    out = spans(job(completed=7), attempts, rows, shares)
    assert [(s.phase, s.worker_id, s.attempt) for s in out] == [
        ("queue", None, None),
        ("run", "w1", 1),
        ("boot", "w2", None),
        ("load", "w2", None),
        ("run", "w2", 2),
    ]
    runs = [s for s in out if s.phase == "run"]
    assert [(r.billable, r.amount) for r in runs] == [(False, Decimal(0)), (True, Decimal("0.5"))]


def test_a_job_still_waiting_has_an_open_queue_and_nothing_else() -> None:
    (queue,) = spans(job(), [], [], {})
    assert queue.phase == "queue" and queue.end is None


def test_a_job_that_expired_in_the_queue_ends_there() -> None:
    (queue,) = spans(job(completed=30), [], [], {})
    assert queue.end == at(30)

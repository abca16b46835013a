"""What the checker reads and reports: the evidence a scenario hands it, the rows it reads at one
moment (`Snapshot`), how long it waits (`Bounds`), and a broken invariant (`Violation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from control_plane.domain.states import TERMINAL
from control_plane.reconcile.driver import WAKEUP_SWEEP_EVERY
from control_plane.reconcile.jobs import WAKEUP_GRACE_S
from tests.faults.receiver import Delivery

# kombu's Redis transport keeps delivered, unacknowledged messages here (its default names).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
# Attempt outcomes that are the platform's fault: never an accepted result, never billed.
PLATFORM_FAULTS = frozenset({"worker_lost"})
# Webhook events that happen once per job (so: one message id per job).
ONCE_PER_JOB_EVENTS = frozenset({"job.completed"})
# How far a webhook's timestamp may be from its arrival (the Standard Webhooks tolerance).
WEBHOOK_TOLERANCE_S = 300.0
# A stopped worker's records must cover its life to this (docs/billing.md: within one second).
LIFETIME_TOLERANCE_S = 1.0
# At most this many lines per invariant in a report; the count says how many there were.
MAX_LINES = 20
TERMINAL_STATUSES = frozenset(s.value for s in TERMINAL)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant, in words (ids, counts and ages only)."""

    invariant: str  # "I1" … "I6"
    kind: str  # what broke, for counting: lost, duplicate_result, duplicate_billing, gap, ...
    detail: str  # what was seen, with the ids to look up

    def __str__(self) -> str:
        return f"{self.invariant} {self.kind}: {self.detail}"


# I6's bound is the platform's own: the reconciler forgets an unacked wake-up once its delivery
# is WAKEUP_GRACE_S old, in a sweep run at most every WAKEUP_SWEEP_EVERY, on a tick (every
# autoscaler_interval_s, at most 2 s, plus the tick's own length). A message left by a worker
# killed between its report and its ack can so stay WAKEUP_GRACE_S + WAKEUP_SWEEP_EVERY + a
# tick after it was delivered; 15 s, the two alone, was missed by 0.3 s once (a worker
# SIGKILLed 0.1 s after its job's end, network faults scenario).
UNACKED_BOUND_S = WAKEUP_GRACE_S + WAKEUP_SWEEP_EVERY.total_seconds() + 5.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """How long the checker waits before a "not yet" becomes a violation."""

    terminal_s: float = 300.0  # I1: admitted jobs are terminal within this (from check())
    settle_s: float = 60.0  # I2/I3/I6: billing, webhooks and acks settle within this, after I1
    unacked_s: float = UNACKED_BOUND_S  # I6: a message needed by nothing may stay unacked


@dataclass(frozen=True, slots=True)
class WebhookEvidence:
    """What a scenario that used webhooks hands the checker."""

    log: Callable[[], list[Delivery]]  # the receiver's log, read again while settling
    secret: str  # the tenant's `whsec_` signing secret
    job_ids: frozenset[str]  # admitted jobs submitted with the receiver's URL


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a scenario knows after its faults: where the stores are and what it was promised."""

    database_url: str  # platform.json → database_url
    redis_url: str  # platform.json → redis_url
    admitted: Sequence[str]  # job ids the client got 201/202 for
    webhooks: WebhookEvidence | None = None  # None: the scenario used no webhooks


@dataclass(frozen=True, slots=True)
class Unacked:
    """One delivered, unacknowledged broker message (kombu's `unacked` entry)."""

    tag: str  # kombu delivery tag
    delivered_at: float  # time.time() when it was delivered (its `unacked_index` score)
    task: str | None  # Celery task name from the message headers
    job_id: str | None  # the job it wakes or concerns (kwargs.job_id), if any
    eta: float | None  # a Celery countdown (retry) held by the worker until then


@dataclass(slots=True)
class Snapshot:
    """Rows read at one moment; the judges need nothing else."""

    now: float  # time.time() of the read
    # admitted job id → (status, attempt, completed_at)
    jobs: dict[str, tuple[str, int, float | None]]
    # the same, for other jobs that unacked messages point at (warm-up calls, say)
    others: dict[str, tuple[str, int, float | None]] = field(default_factory=dict)
    # (job id, attempt, outcome, ended)
    attempts: list[tuple[str, int, str | None, bool]] = field(default_factory=list)
    # (billing record id, job id, attempt, billable)
    allocations: list[tuple[int, str, int, bool]] = field(default_factory=list)
    # worker id → (started_at or None for a warm-pool worker, stopped_at or None)
    workers: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # worker id → [(record id, start, end)] sorted by start
    records: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)
    drift: list[dict[str, Any]] = field(default_factory=list)  # billing.check's issues
    unacked: list[Unacked] = field(default_factory=list)
    # (stream, group, entries pending longer than the bound)
    stream_pending: list[tuple[str, str, int]] = field(default_factory=list)
    streams_checked: int = 0  # how many streams XINFO GROUPS looked at


def assert_holds(violations: Iterable[Violation], invariant: str | None = None) -> None:
    """Fail with the violations (of `invariant`, or all) listed; print them in any case."""
    found = [v for v in violations if invariant is None or v.invariant == invariant]
    lines = [str(v) for v in found[:MAX_LINES]]
    if len(found) > MAX_LINES:
        lines.append(f"... and {len(found) - MAX_LINES} more")
    for line in lines:
        print(line)
    assert not found, f"{len(found)} violation(s):\n" + "\n".join(lines)

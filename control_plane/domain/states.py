"""Job states (DESIGN §4), the groups the code reasons with, and job kinds.

    queued → starting → running → succeeded | failed | canceled | expired | timed_out
                 ↖ worker lost ↙  (running → queued: a new attempt; after the last, failed)

Every move into a terminal state goes through `services/jobs/finish.py`; a claim (pending → running)
through `services/jobs/claims.claim`; a requeue through `reconcile/jobs.requeue_orphans`.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    # A worker is booting for the job; `status_reason` says why it waits (no_capacity, ...).
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    # Its ttl passed before it started.
    EXPIRED = "expired"
    # It ran past its execution limit.
    TIMED_OUT = "timed_out"


TERMINAL = frozenset(
    {
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELED,
        JobStatus.EXPIRED,
        JobStatus.TIMED_OUT,
    }
)
# NOTE: terminal states are final: `finish` only ends a job that is still active.
PENDING = frozenset({JobStatus.QUEUED, JobStatus.STARTING})
ACTIVE = PENDING | {JobStatus.RUNNING}


def is_terminal(status: str) -> bool:
    return status in TERMINAL


class JobKind(StrEnum):
    """Priority class: sync before async before batch."""

    SYNC = "sync"
    ASYNC = "async"
    BATCH = "batch"

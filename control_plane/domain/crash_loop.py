"""Crash-loop policy: back off between failed worker starts, then fail the waiting jobs.

Pure: a function of the deployment version's recent worker outcomes and `now`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# After this many workers of one deployment version failed in a row, waiting jobs fail fast
# instead of hanging (a bad model URI, a broken checkpoint).
GIVE_UP_AFTER = 3
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True)
class BootHistory:
    consecutive_failures: int  # failed workers in a row, newest first, of the current version
    last_failure_at: datetime | None  # when the newest of them failed
    last_reason: str | None  # its reported reason


@dataclass(frozen=True, slots=True)
class StartVerdict:
    start: bool  # a new worker may be started now
    give_up: bool  # waiting jobs should fail: starting more workers will not help
    reason: str  # why (for job status_reason and logs)


@dataclass(frozen=True, slots=True)
class PastWorker:
    failed: bool  # it ended in `failed`
    served: bool  # it reached idle or busy once (booted fine)
    stopped_at: datetime | None  # when it ended
    reason: str | None  # why it ended


def history_of(newest_first: list[PastWorker]) -> BootHistory:
    """The run of workers, newest first, that failed before serving. A worker that served once
    booted fine: its later death is not a crash loop of the deployment version."""
    count, last_at, last_reason = 0, None, None
    for w in newest_first:
        if not w.failed or w.served:
            break
        if count == 0:
            last_at, last_reason = w.stopped_at, w.reason
        count += 1
    return BootHistory(count, last_at, last_reason)


def backoff_s(consecutive_failures: int) -> float:
    if consecutive_failures <= 0:
        return 0.0
    return min(2.0 ** (consecutive_failures - 1), MAX_BACKOFF_S)


def may_start(history: BootHistory, now: datetime) -> StartVerdict:
    n = history.consecutive_failures
    if n >= GIVE_UP_AFTER:
        return StartVerdict(start=False, give_up=True, reason="crash_loop")
    if n and history.last_failure_at is not None:
        waited = (now - history.last_failure_at).total_seconds()
        if waited < backoff_s(n):
            return StartVerdict(start=False, give_up=False, reason="crash_loop")
    return StartVerdict(start=True, give_up=False, reason="no_capacity")

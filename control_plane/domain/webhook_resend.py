"""When a `*.completed` webhook still pending must be sent again (pure; the reconciler asks).

A delivery lives in a Celery message until its attempt is recorded. A Celery worker killed
while it holds the message (running, or waiting for a retry's countdown), or an API killed
between a job's commit and the enqueue, loses it, and the broker would not redeliver it before
its visibility timeout (an hour). The subject's `webhook_status` stays `pending`, and the
attempts recorded so far say when the next one was due: past that, plus a grace for a busy
queue, the chain is taken to be lost and its next attempt is sent again, under the same message
id. A chain that was only late is then not doubled: an attempt already recorded is skipped at
delivery, and receivers deduplicate on `webhook-id`.

NOTE: a redelivery the tenant asked for (a new message id, known only to its Celery message)
that is lost before its first attempt is not found: the latest recorded attempt is then the
delivered one of the chain before. The tenant can ask again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

# How late past its due time an attempt must be before its chain counts as lost.
GRACE = timedelta(seconds=30)
# The largest jitter `webhook_delivery.retry_delay_s` adds to a retry's delay.
MAX_JITTER = 0.25


@dataclass(frozen=True, slots=True)
class Recorded:
    """The latest recorded attempt of a subject's `*.completed` webhook."""

    msg_id: str
    attempt: int
    at: datetime
    delivered: bool


def attempt_to_resend(
    now: datetime, ended_at: datetime, last: Recorded | None, schedule: tuple[float, ...]
) -> int | None:
    """The attempt to send again for a subject that ended at `ended_at`, whose latest recorded
    attempt is `last` (None: none yet); None while the chain may still be on its way, when
    its retries are over, or when the latest attempt was delivered."""
    if last is None:
        return 1 if now - ended_at > GRACE else None
    if last.delivered or last.attempt > len(schedule):
        return None  # over (a failed last attempt marks the subject failed when recorded)
    due = last.at + timedelta(seconds=schedule[last.attempt - 1] * (1 + MAX_JITTER))
    return last.attempt + 1 if now - due > GRACE else None

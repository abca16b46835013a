"""Leader election rules of the reconciler's lease (pure; the I/O is in reconcile/lease.py).

A replica leads while it holds the lease and renews it every tick. Two rules:
- `believes_it_leads`: between renewals, a leader trusts its lease only for `lease_s` minus a
  margin after the last renewal it saw succeed, measured on its own monotonic clock. Past that,
  another replica may already hold the lease, so it stops acting even if it cannot reach the
  lease store to find out (the fencing token catches whatever still slips through).
- `claim` (a Kubernetes Lease, which holds a record rather than expiring by itself): the
  holder renews; anyone takes a lease that nobody holds, or whose record it has seen unchanged
  for the lease's duration, timed on its own monotonic clock (as client-go's leader election
  does: the holder's `renewTime` is another host's wall clock, and comparing it with ours would
  let a skewed clock take a live lease or keep a dead one); everyone else waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

# Seconds of a lease a leader never relies on: clock rate differences between hosts and the
# time a renewal takes to travel. A leader whose renewals keep failing stops acting this long
# before another replica can take its lease.
SAFETY_MARGIN_S = 2.0


def believes_it_leads(last_renewed: float | None, lease_s: float, now: float) -> bool:
    """`last_renewed`, `now`: this replica's monotonic clock; None: it never held the lease."""
    return last_renewed is not None and now - last_renewed < lease_s - SAFETY_MARGIN_S


class Claim(StrEnum):
    RENEW = "renew"  # ours: write a new renew time
    TAKE = "take"  # free or expired: write ourselves as holder (one more transition)
    WAIT = "wait"  # another replica holds it


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str | None  # holderIdentity; None or "": released
    renewed_at: datetime | None  # renewTime
    duration_s: float  # leaseDurationSeconds


@dataclass(frozen=True, slots=True)
class Observed:
    """A lease record as this replica last read it, and when it first read it so (its own
    monotonic clock): a renewal changes the record, and restarts the count."""

    record: LeaseRecord
    since: float


def observe(previous: Observed | None, record: LeaseRecord | None, now: float) -> Observed | None:
    """What this replica knows after reading `record` at `now` (monotonic)."""
    if record is None:
        return None
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now)


def claim(observed: Observed | None, me: str, now: float) -> Claim:
    """What replica `me` does with the lease it read (`observe`'s answer; None: no lease
    object yet: take it). `now`: its monotonic clock."""
    if observed is None or not observed.record.holder:
        return Claim.TAKE
    if observed.record.holder == me:
        return Claim.RENEW
    if now - observed.since >= observed.record.duration_s:
        return Claim.TAKE  # unchanged for a whole duration, as seen here
    return Claim.WAIT

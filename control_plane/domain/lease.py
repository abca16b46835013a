"""Leader election rules of the reconciler's lease (pure; the I/O is in reconcile/lease.py).

A replica leads while it holds the lease and renews it every tick. Two rules:
- `believes_it_leads`: between renewals, a leader trusts its lease only for `lease_s` minus a
  margin after the last renewal it saw succeed, measured on its own monotonic clock. Past that,
  another replica may already hold the lease, so it stops acting even if it cannot reach the
  lease store to find out (the fencing token catches whatever still slips through).
- `claim` (a Kubernetes Lease, which holds a record rather than expiring by itself): the
  holder renews; anyone takes a lease whose renewal is older than its duration, or that nobody
  holds; everyone else waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
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


def claim(record: LeaseRecord | None, me: str, now: datetime) -> Claim:
    """What replica `me` does with the lease it read (None: no lease object yet: take it)."""
    if record is None or not record.holder:
        return Claim.TAKE
    if record.holder == me:
        return Claim.RENEW
    if record.renewed_at is None or now - record.renewed_at >= timedelta(seconds=record.duration_s):
        return Claim.TAKE
    return Claim.WAIT

"""Split a busy billing segment's amount among the job attempts it served (pure, Decimal).

Each attempt's weight is the tokens it processed inside the segment — its tokens × the share
of its run that falls in the segment (tokens flow at an even rate over a run, to the
precision a per-segment split needs). With no token counts, the overlap in time is the
weight. Rounding: largest remainder at AMOUNT_QUANTUM, ties broken by (job id, attempt), so
the shares add up to the segment's amount exactly, whatever the order of the input.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal

from control_plane.domain.billing_math import AMOUNT_QUANTUM, SECONDS_QUANTUM, duration_seconds


@dataclass(frozen=True, slots=True)
class AttemptSpan:
    job_id: str  # the job
    attempt: int  # its attempt number
    start: datetime  # when the worker claimed it
    end: datetime  # when it finished (or the segment's end while it runs on)
    tokens: int  # prompt + generated tokens of the whole attempt
    billable: bool  # False: failed through the platform's fault (absorbed)


@dataclass(frozen=True, slots=True)
class Share:
    job_id: str
    attempt: int
    seconds: Decimal  # overlap of the attempt with the segment
    amount: Decimal  # its part of the segment's amount
    billable: bool


def allocate(
    seg_start: datetime, seg_end: datetime, amount: Decimal, spans: list[AttemptSpan]
) -> list[Share]:
    """Shares of `amount` for the attempts overlapping [seg_start, seg_end); [] if none."""
    overlapping = []
    for s in sorted(spans, key=lambda s: (s.job_id, s.attempt)):
        lo, hi = max(s.start, seg_start), min(s.end, seg_end)
        if hi > lo:
            overlap = duration_seconds(lo, hi)
            run = duration_seconds(s.start, s.end) if s.end > s.start else overlap
            overlapping.append((s, overlap, Decimal(s.tokens) * overlap / run))
    if not overlapping:
        return []
    weights = [w for _, _, w in overlapping]
    if sum(weights) == 0:
        weights = [ov for _, ov, _ in overlapping]
    total_weight = sum(weights)
    units = int(amount / AMOUNT_QUANTUM)  # amount in quanta (amounts are quantized)
    raw = [Decimal(units) * w / total_weight for w in weights]
    floors = [int(r.to_integral_value(rounding=ROUND_FLOOR)) for r in raw]
    left = units - sum(floors)
    # Largest remainders first; the stable sort keeps (job id, attempt) order among ties.
    order = sorted(range(len(raw)), key=lambda i: raw[i] - floors[i], reverse=True)
    for i in order[:left]:
        floors[i] += 1
    return [
        Share(
            job_id=s.job_id,
            attempt=s.attempt,
            seconds=ov.quantize(SECONDS_QUANTUM),
            amount=Decimal(n) * AMOUNT_QUANTUM,
            billable=s.billable,
        )
        for (s, ov, _), n in zip(overlapping, floors, strict=True)
    ]


def billable_boot_seconds(
    seconds: Decimal, already_billed: Decimal, max_boot_s: Decimal
) -> Decimal:
    """Boot and load are billed up to max_boot_s per worker, never beyond."""
    return max(Decimal(0), min(seconds, max_boot_s - already_billed))

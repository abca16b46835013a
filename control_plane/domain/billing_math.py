"""Billing arithmetic: pure, Decimal only, rounding stated once.

Rounding rules (docs/billing.md): a segment's seconds are its exact duration rounded half-even
to the millisecond; its amount is seconds × rate rounded half-even to 1e-9 USD. Sums are
taken over the rounded amounts, so totals are reproducible from the records alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

SECONDS_QUANTUM = Decimal("0.001")
AMOUNT_QUANTUM = Decimal("0.000000001")

# Worker states and the billing phase each one is charged as.
PHASE_OF_STATE = {
    "booting": "boot",
    "loading": "load",
    "warming": "warm",
    "idle": "idle",
    "busy": "busy",
    "draining": "drain",
}
# Every second of a warm-pool worker before its assignment (booting or waiting): the
# platform's cost, billed to its own tenant; the assigned deployment's tenant pays from then on.
POOL_PHASE = "pool"


def phase_of(state: str, pooled: bool) -> str | None:
    """The billing phase of a worker's time in `state` (None: not billed); `pooled`: a
    warm-pool worker with no deployment yet."""
    phase = PHASE_OF_STATE.get(state)
    return POOL_PHASE if pooled and phase is not None else phase


@dataclass(frozen=True, slots=True)
class SegmentCost:
    seconds: Decimal  # duration, rounded to SECONDS_QUANTUM
    amount: Decimal  # seconds × rate, rounded to AMOUNT_QUANTUM


def duration_seconds(start: datetime, end: datetime) -> Decimal:
    """Exact duration in seconds (microsecond precision) as a Decimal; never negative."""
    if end < start:
        raise ValueError(f"segment ends before it starts: {start.isoformat()} > {end.isoformat()}")
    delta = end - start
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return Decimal(micros) / Decimal(1_000_000)


def segment_cost(start: datetime, end: datetime, rate_per_s: Decimal) -> SegmentCost:
    seconds = duration_seconds(start, end).quantize(SECONDS_QUANTUM, rounding=ROUND_HALF_EVEN)
    amount = (seconds * rate_per_s).quantize(AMOUNT_QUANTUM, rounding=ROUND_HALF_EVEN)
    return SegmentCost(seconds=seconds, amount=amount)

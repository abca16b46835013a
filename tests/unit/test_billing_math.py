import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.domain.billing_math import duration_seconds, segment_cost

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_seconds_and_amount_round_half_even() -> None:
    cost = segment_cost(T0, T0 + timedelta(microseconds=1_500), Decimal("0.000020"))
    assert cost.seconds == Decimal("0.002")  # 0.0015 → 0.002 (half-even: 2 is even)
    cost = segment_cost(T0, T0 + timedelta(microseconds=2_500), Decimal("0.000020"))
    assert cost.seconds == Decimal("0.002")  # 0.0025 → 0.002
    assert cost.amount == Decimal("0.000000040")


def test_negative_segment_is_refused() -> None:
    with pytest.raises(ValueError, match="ends before"):
        segment_cost(T0, T0 - timedelta(seconds=1), Decimal("1"))


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=20))
def test_durations_add_up_exactly(micros: list[int]) -> None:
    # Contiguous segments: the exact durations sum to the whole span, never a float error.
    edges = [T0]
    for m in micros:
        edges.append(edges[-1] + timedelta(microseconds=m))
    parts = sum(duration_seconds(a, b) for a, b in itertools.pairwise(edges))
    assert parts == duration_seconds(edges[0], edges[-1])
    assert isinstance(parts, Decimal)

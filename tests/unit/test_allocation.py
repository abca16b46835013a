"""Pure allocation math: shares add up exactly, never negative, independent of input order."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from control_plane.domain.allocation import AttemptSpan, allocate, billable_boot_seconds

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def span(job: str, start_s: float, end_s: float, tokens: int, billable: bool = True) -> AttemptSpan:
    return AttemptSpan(
        job, 1, T0 + timedelta(seconds=start_s), T0 + timedelta(seconds=end_s), tokens, billable
    )


def test_single_job_takes_the_whole_segment() -> None:
    shares = allocate(T0, T0 + timedelta(seconds=2), Decimal("0.000040000"), [span("a", 0, 2, 10)])
    assert [(s.job_id, s.amount, s.seconds) for s in shares] == [
        ("a", Decimal("0.000040000"), Decimal("2.000"))
    ]


def test_shares_follow_tokens_processed_in_the_segment() -> None:
    # a: 30 tokens over the whole 10 s; b: 10 tokens, all inside the segment.
    shares = allocate(
        T0,
        T0 + timedelta(seconds=10),
        Decimal("0.000000040"),
        [span("a", 0, 10, 30), span("b", 5, 10, 10)],
    )
    assert {s.job_id: s.amount for s in shares} == {
        "a": Decimal("0.000000030"),
        "b": Decimal("0.000000010"),
    }


def test_only_the_overlap_counts() -> None:
    # b ran 0..20 s with 20 tokens: only half of them fall in the 10..20 segment.
    shares = allocate(
        T0 + timedelta(seconds=10),
        T0 + timedelta(seconds=20),
        Decimal("0.000000020"),
        [span("a", 10, 20, 10), span("b", 0, 20, 20), span("c", 20, 30, 99)],
    )
    assert {s.job_id: s.amount for s in shares} == {
        "a": Decimal("0.000000010"),
        "b": Decimal("0.000000010"),
    }


def test_no_tokens_falls_back_to_time() -> None:
    shares = allocate(
        T0,
        T0 + timedelta(seconds=4),
        Decimal("0.000000004"),
        [span("a", 0, 4, 0), span("b", 0, 1, 0)],
    )
    assert {s.job_id: s.amount for s in shares} == {
        "a": Decimal("0.000000003"),
        "b": Decimal("0.000000001"),
    }


def test_boot_cap() -> None:
    assert billable_boot_seconds(Decimal(30), Decimal(0), Decimal(600)) == 30
    assert billable_boot_seconds(Decimal(30), Decimal(590), Decimal(600)) == 10
    assert billable_boot_seconds(Decimal(30), Decimal(600), Decimal(600)) == 0


spans = st.lists(
    st.tuples(st.integers(0, 100), st.integers(1, 100), st.integers(0, 5000), st.booleans()),
    min_size=1,
    max_size=12,
)


@given(spans, st.integers(1, 10**9), st.randoms())
def test_shares_sum_exactly_and_ignore_input_order(
    raw: list[tuple[int, int, int, bool]], units: int, rnd: object
) -> None:
    items = [span(f"j{i}", a, a + d, t, b) for i, (a, d, t, b) in enumerate(raw)]
    amount = Decimal(units) * Decimal("0.000000001")
    start, end = T0 + timedelta(seconds=20), T0 + timedelta(seconds=120)
    shares = allocate(start, end, amount, items)
    if shares:
        assert sum(s.amount for s in shares) == amount
    assert all(s.amount >= 0 for s in shares)
    shuffled = list(items)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert allocate(start, end, amount, shuffled) == shares
    # Replaying the same input gives the same shares (idempotent).
    assert allocate(start, end, amount, items) == shares

"""The reconciler lease's rules (domain/lease.py): when a leader trusts its lease, and what a
replica does with a Kubernetes Lease it read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.domain.lease import (
    SAFETY_MARGIN_S,
    Claim,
    LeaseRecord,
    believes_it_leads,
    claim,
    observe,
)

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def test_a_leader_trusts_its_lease_until_the_margin_before_it_runs_out() -> None:
    assert believes_it_leads(100.0, 10.0, 100.0)
    assert believes_it_leads(100.0, 10.0, 100.0 + 10.0 - SAFETY_MARGIN_S - 0.01)
    assert not believes_it_leads(100.0, 10.0, 100.0 + 10.0 - SAFETY_MARGIN_S)
    assert not believes_it_leads(None, 10.0, 100.0), "never renewed: never leads"


def test_nobody_holds_it_or_no_lease_yet_take_it() -> None:
    assert claim(None, "a", 0.0) is Claim.TAKE
    assert claim(observe(None, LeaseRecord(None, None, 10), 0.0), "a", 0.0) is Claim.TAKE
    assert claim(observe(None, LeaseRecord("", T0, 10), 0.0), "a", 0.0) is Claim.TAKE


def test_the_holder_renews_even_past_the_duration() -> None:
    seen = observe(None, LeaseRecord("a", T0, 10), 0.0)
    assert claim(seen, "a", 1.0) is Claim.RENEW
    assert claim(seen, "a", 60.0) is Claim.RENEW


def test_another_replica_takes_it_once_it_saw_it_unchanged_for_the_duration() -> None:
    held = LeaseRecord("a", T0, 10)
    seen = observe(None, held, 100.0)
    assert claim(seen, "b", 109.9) is Claim.WAIT
    assert claim(observe(seen, held, 109.9), "b", 109.9) is Claim.WAIT
    assert claim(observe(seen, held, 110.0), "b", 110.0) is Claim.TAKE
    # a renewal (a new record) restarts the count, whatever its renewTime says
    renewed = LeaseRecord("a", T0 - timedelta(hours=3), 10)
    again = observe(seen, renewed, 109.0)
    assert again is not None and again.since == 109.0
    assert claim(again, "b", 118.9) is Claim.WAIT
    # a record first seen already old (by its wall clock) is still timed from first sight
    stale = observe(None, LeaseRecord("a", T0 - timedelta(days=1), 10), 500.0)
    assert claim(stale, "b", 500.0) is Claim.WAIT

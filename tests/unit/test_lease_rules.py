"""The reconciler lease's rules (domain/lease.py): when a leader trusts its lease, and what a
replica does with a Kubernetes Lease it read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.domain.lease import SAFETY_MARGIN_S, Claim, LeaseRecord, believes_it_leads, claim

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def test_a_leader_trusts_its_lease_until_the_margin_before_it_runs_out() -> None:
    assert believes_it_leads(100.0, 10.0, 100.0)
    assert believes_it_leads(100.0, 10.0, 100.0 + 10.0 - SAFETY_MARGIN_S - 0.01)
    assert not believes_it_leads(100.0, 10.0, 100.0 + 10.0 - SAFETY_MARGIN_S)
    assert not believes_it_leads(None, 10.0, 100.0), "never renewed: never leads"


def test_nobody_holds_it_or_no_lease_yet_take_it() -> None:
    assert claim(None, "a", T0) is Claim.TAKE
    assert claim(LeaseRecord(None, None, 10), "a", T0) is Claim.TAKE
    assert claim(LeaseRecord("", T0, 10), "a", T0) is Claim.TAKE


def test_the_holder_renews_even_past_the_duration() -> None:
    assert claim(LeaseRecord("a", T0, 10), "a", T0 + timedelta(seconds=1)) is Claim.RENEW
    assert claim(LeaseRecord("a", T0, 10), "a", T0 + timedelta(seconds=60)) is Claim.RENEW


def test_another_replica_waits_until_the_duration_has_passed_then_takes_it() -> None:
    held = LeaseRecord("a", T0, 10)
    assert claim(held, "b", T0 + timedelta(seconds=9.9)) is Claim.WAIT
    assert claim(held, "b", T0 + timedelta(seconds=10)) is Claim.TAKE
    assert claim(LeaseRecord("a", None, 10), "b", T0) is Claim.TAKE, "never renewed"

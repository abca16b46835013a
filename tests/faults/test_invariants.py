"""The checker itself, on hand-made rows: each judge must see the breakage it exists for
(a checker that never fails proves nothing), and stay quiet on a clean ledger. Pure, fast."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

from standardwebhooks import Webhook

from common.protocol import RUN_JOB_TASK
from tests.faults.invariants import (
    Snapshot,
    Unacked,
    Violation,
    WebhookEvidence,
    judge_broker,
    judge_results,
    judge_terminal,
    judge_tiling,
    judge_webhooks,
)
from tests.faults.receiver import Delivery

SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()
NOW = 1_000_000.0


def kinds(violations: list[Violation]) -> list[str]:
    return sorted(v.kind for v in violations)


def clean() -> Snapshot:
    """Job a: lost once, then succeeded and billed for attempt 2; worker w tiled."""
    return Snapshot(
        now=NOW,
        jobs={"a": ("succeeded", 2, NOW - 50)},
        attempts=[("a", 1, "worker_lost", True), ("a", 2, "succeeded", True)],
        allocations=[(1, "a", 1, False), (2, "a", 2, True)],
        workers={"w": (0.0, 30.0)},
        records={"w": [(1, 0.0, 10.0), (2, 10.0, 30.0)]},
    )


def test_a_clean_ledger_has_no_violations() -> None:
    snap = clean()
    assert judge_terminal(["a"], snap.jobs, 1) == []
    assert judge_results(snap) == []
    assert judge_tiling(snap) == []
    assert judge_broker(snap, 15) == []


def test_lost_and_unknown_jobs_break_i1() -> None:
    jobs = {"a": ("running", 1, None), "b": ("failed", 3, NOW)}
    assert kinds(judge_terminal(["a", "b", "c"], jobs, 5)) == ["lost", "lost"]


def test_double_results_and_double_billing_break_i2() -> None:
    snap = clean()
    snap.attempts[0] = ("a", 1, "succeeded", True)  # a second accepted result
    snap.allocations[0] = (1, "a", 1, True)  # ... billed too
    snap.allocations.append((2, "a", 2, True))  # and one allocation written twice
    assert kinds(judge_results(snap)) == [
        "billed_wrong_attempt",
        "duplicate_billing",
        "duplicate_billing",
        "duplicate_result",
    ]


def test_unbilled_lost_billed_and_open_attempts_break_i2() -> None:
    snap = clean()
    snap.allocations = [(1, "a", 1, True)]
    snap.attempts.append(("a", 3, None, False))
    assert kinds(judge_results(snap)) == ["billed_lost_attempt", "open_attempt"]
    snap.allocations = []
    assert "unbilled" in kinds(judge_results(snap))


def test_gaps_overlaps_duplicates_and_uncovered_life_break_i4() -> None:
    snap = clean()
    snap.records["w"] = [(1, 0.0, 10.0), (2, 9.0, 12.0), (3, 13.0, 20.0), (4, 13.0, 20.0)]
    assert kinds(judge_tiling(snap)) == [
        "duplicate_record",
        "gap",
        "overlap",
        "overlap",
        "uncovered",
    ]


def delivery(
    job_id: str, msg_id: str, secret: str = SECRET, skew_s: float = 0, status: int = 200
) -> Delivery:
    body = json.dumps({"type": "job.completed", "data": {"id": job_id}}).encode()
    stamp = int(time.time())
    sig = Webhook(secret).sign(msg_id, datetime.fromtimestamp(stamp, UTC), body.decode())
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": f"v1,Zm9v {sig}",
    }
    return Delivery(body, headers, stamp + skew_s, status)


def test_webhooks_one_id_per_event_signed_and_arrived_for_i3() -> None:
    ev = WebhookEvidence(log=list, secret=SECRET, job_ids=frozenset({"a", "b"}))
    retried = [delivery("a", "msg_a_completed"), delivery("a", "msg_a_completed")]
    assert kinds(judge_webhooks(retried, ev)) == ["missing_webhook"]  # b never came
    other = "whsec_" + base64.b64encode(b"x" * 24).decode()
    bad = [
        delivery("a", "msg_a_completed"),
        delivery("a", "msg_a_completed_2"),
        delivery("b", "msg_b_completed", secret=other),
        delivery("b", "msg_b_completed", skew_s=900),
    ]
    assert kinds(judge_webhooks(bad, ev)) == [
        "bad_signature",
        "bad_signature",
        "duplicate_webhook_id",
    ]


def test_a_webhook_the_receiver_only_refused_never_arrived_for_i3() -> None:
    ev = WebhookEvidence(log=list, secret=SECRET, job_ids=frozenset({"a", "b"}))
    log = [
        delivery("a", "msg_a_completed", status=500),
        delivery("a", "msg_a_completed", status=0),  # reset, or answered after the timeout
        delivery("a", "msg_a_completed", status=302),
        delivery("b", "msg_b_completed", status=500),
        delivery("b", "msg_b_completed"),  # the retry got through
    ]
    found = judge_webhooks(log, ev)
    assert kinds(found) == ["missing_webhook"]
    assert "job a " in found[0].detail and "only refused attempts" in found[0].detail


def test_unacked_messages_only_count_once_unneeded_for_i6() -> None:
    snap = clean()
    snap.jobs["r"] = ("running", 1, None)
    snap.unacked = [
        Unacked("1", NOW - 600, RUN_JOB_TASK, "r", None),  # its job still runs: needed
        Unacked("2", NOW - 600, "control_plane.deliver_webhook", None, NOW + 60),  # countdown
        Unacked("3", NOW - 600, RUN_JOB_TASK, "a", None),  # its job ended 50 s ago
        Unacked("4", NOW - 5, "control_plane.deliver_webhook", None, None),  # being handled
    ]
    found = judge_broker(snap, 15)
    assert kinds(found) == ["stale_unacked"] and "delivery tag 3" in str(found[0])

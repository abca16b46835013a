"""When a pending `*.completed` webhook is sent again (domain/webhook_resend.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.domain.webhook_resend import GRACE, Recorded, attempt_to_resend

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
SCHEDULE = (5.0, 30.0, 120.0)
S = timedelta(seconds=1)


def recorded(attempt: int, ago: timedelta, delivered: bool = False) -> Recorded:
    return Recorded("msg_job_x_completed", attempt, NOW - ago, delivered)


def test_nothing_recorded_the_first_attempt_once_the_grace_has_passed() -> None:
    assert attempt_to_resend(NOW, NOW - GRACE + S, None, SCHEDULE) is None
    assert attempt_to_resend(NOW, NOW - GRACE - S, None, SCHEDULE) == 1


def test_a_retry_counts_as_lost_only_past_its_longest_delay_and_the_grace() -> None:
    longest = timedelta(seconds=30 * 1.25)  # attempt 2 waits 30 s plus up to 25% jitter
    ended = NOW - timedelta(hours=1)
    assert attempt_to_resend(NOW, ended, recorded(2, longest + GRACE - S), SCHEDULE) is None
    assert attempt_to_resend(NOW, ended, recorded(2, longest + GRACE + S), SCHEDULE) == 3


def test_delivered_or_out_of_retries_is_over() -> None:
    ended = NOW - timedelta(days=1)
    assert attempt_to_resend(NOW, ended, recorded(1, timedelta(hours=1), True), SCHEDULE) is None
    assert attempt_to_resend(NOW, ended, recorded(4, timedelta(hours=1)), SCHEDULE) is None
    assert attempt_to_resend(NOW, ended, recorded(3, timedelta(hours=1)), SCHEDULE) == 4

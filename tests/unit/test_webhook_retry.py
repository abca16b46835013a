"""Retry timing of webhook deliveries: exponential schedule from settings, bounded jitter."""

from __future__ import annotations

import random

import pytest

from control_plane.services.jobs.webhook_delivery import retry_delay_s
from control_plane.settings import Settings


def test_delays_follow_the_schedule_with_at_most_25_percent_jitter() -> None:
    schedule = (5.0, 30.0, 120.0)
    rng = random.Random(7)
    for attempt, base in enumerate(schedule, start=1):
        for _ in range(50):
            delay = retry_delay_s(attempt, schedule, rng)
            assert delay is not None and base <= delay <= base * 1.25


def test_retries_end_after_the_schedule() -> None:
    assert retry_delay_s(4, (1.0, 2.0, 3.0), random.Random(0)) is None


def test_default_schedule_spans_hours_and_is_compressible_from_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert sum(Settings().webhook_retry_schedule_s) > 6 * 3600
    monkeypatch.setenv("PLATFORM_WEBHOOK_RETRY_SCHEDULE_S", "[0.2,0.2,0.2]")
    assert Settings().webhook_retry_schedule_s == (0.2, 0.2, 0.2)

from datetime import UTC, datetime, timedelta

import pytest

from control_plane.domain.autoscaler import DeploymentLoad, ScalingPolicy, decide

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
POLICY = ScalingPolicy(min_workers=0, max_workers=3, target_concurrency=2, scaledown_window_s=60)


def load(queued: int, running: int, workers: int, quiet_s: float | None) -> DeploymentLoad:
    last = None if quiet_s is None else NOW - timedelta(seconds=quiet_s)
    return DeploymentLoad(queued=queued, running=running, workers=workers, last_demand_at=last)


def test_scale_from_zero_when_work_waits() -> None:
    d = decide(POLICY, load(1, 0, 0, 0), NOW)
    assert (d.desired, d.reason) == (1, "scale_from_zero")


def test_nothing_runs_while_nobody_calls() -> None:
    assert decide(POLICY, load(0, 0, 0, None), NOW).desired == 0


def test_demand_counts_running_and_queued_against_target_concurrency() -> None:
    assert decide(POLICY, load(3, 2, 1, 0), NOW).desired == 3  # ceil(5 / 2), capped at 3
    assert decide(POLICY, load(20, 0, 1, 0), NOW).desired == 3


@pytest.mark.parametrize(("quiet_s", "desired"), [(59.9, 1), (60.0, 0), (None, 0)])
def test_scale_down_only_after_the_window(quiet_s: float | None, desired: int) -> None:
    assert decide(POLICY, load(0, 0, 1, quiet_s), NOW).desired == desired


def test_min_workers_is_kept() -> None:
    policy = ScalingPolicy(min_workers=1, max_workers=2, target_concurrency=1, scaledown_window_s=0)
    d = decide(policy, load(0, 0, 2, 1000), NOW)
    assert (d.desired, d.reason) == (1, "min_workers")
    assert decide(policy, load(0, 0, 0, None), NOW).desired == 1

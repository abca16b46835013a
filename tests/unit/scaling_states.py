"""The deployment states `decide()`'s tests build, on a fake clock (plain floats)."""

from __future__ import annotations

import dataclasses
import random

from control_plane.domain.scaling import (
    ArrivalHistory,
    DeploymentState,
    ScaleDecision,
    ScalingPolicy,
    decide,
    refit,
)
from control_plane.domain.scaling.decide import (
    REASONS,
)
from control_plane.domain.scaling.models import Models

T0 = 1_000_000.0
# Each part on its own: no job may wait for a ready worker here (the wait has its own tests).
POLICY = ScalingPolicy(
    min_workers=0, max_workers=8, target_concurrency=4, scaledown_window_s=600, queue_wait_s=0
)
WAITING = dataclasses.replace(POLICY, queue_wait_s=2.0)
SERVICE_S = 5.0  # what a job holds its slot, as the states below say


def state(**kw: object) -> DeploymentState:
    base = DeploymentState(
        policy=POLICY,
        queued=0,
        running=0,
        ready=0,
        booting_since=(),
        stable_concurrency=0.0,
        panic_concurrency=0.0,
        last_arrival_at=None,
        boot_s=30.0,
        service_s=SERVICE_S,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def run(s: DeploymentState, now: float) -> ScaleDecision:
    d = decide(s, now)
    assert d.reason in REASONS
    return d


def periodic_models(
    period_s: float, jitter_s: float, n: int, boot_s: float
) -> tuple[Models, float]:
    rng = random.Random(7)
    history, t = ArrivalHistory(), T0
    for _ in range(n):
        t += period_s + rng.uniform(-jitter_s, jitter_s)
        history.record(t)
    return refit(history.stats(t + 1), POLICY, boot_s, SERVICE_S), t


def ramp_models(now: float) -> Models:
    """Arrivals per 10 s bucket rising from 2 to 60 over ten minutes."""
    history = ArrivalHistory()
    for b in range(60):
        start = now - 600 + b * 10
        n = 2 + b
        for i in range(n):
            history.record(start + 10 * i / n)
    return refit(history.stats(now), POLICY, 30.0, SERVICE_S)


def forecast_state() -> DeploymentState:
    """Three full workers ahead of a rising ramp."""
    return state(
        ready=3,
        running=4 * 3,
        stable_concurrency=12,
        panic_concurrency=12,
        last_arrival_at=T0,
        service_s=2.0,
        models=ramp_models(T0),
    )

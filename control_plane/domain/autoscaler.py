"""Autoscaler decision: pure function of (policy, load, now) → how many workers to run.

The scaling reconciler (`control_plane/reconcile/scale.py`) calls it once per deployment and
tick; a trace simulator must call the same `decide`. This is the reactive part: scale from zero
when work waits, keep enough workers for `target_concurrency`, and scale down only after
`scaledown_window_s` without demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    min_workers: int  # floor, kept even with no traffic (0 = scale to zero)
    max_workers: int  # ceiling, never exceeded
    target_concurrency: int  # jobs one worker should hold at once
    scaledown_window_s: float  # seconds without demand before workers are removed


@dataclass(frozen=True, slots=True)
class DeploymentLoad:
    queued: int  # jobs waiting for a worker (queued + starting)
    running: int  # jobs held by a worker
    workers: int  # live workers (booting … busy), draining ones excluded
    last_demand_at: datetime | None  # last time queued + running was > 0 (None: never)


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    desired: int  # workers the deployment should have now
    reason: str  # why: scale_from_zero, demand, scale_down_window, min_workers, steady


def decide(policy: ScalingPolicy, load: DeploymentLoad, now: datetime) -> ScaleDecision:
    demand = load.queued + load.running
    needed = math.ceil(demand / max(policy.target_concurrency, 1))
    wanted = min(max(needed, policy.min_workers), policy.max_workers)
    if wanted > load.workers:
        reason = "scale_from_zero" if load.workers == 0 else "demand"
        return ScaleDecision(wanted, reason)
    if wanted < load.workers:
        quiet_s = (
            math.inf if load.last_demand_at is None else (now - load.last_demand_at).total_seconds()
        )
        # Capacity above what demand needs goes only after a full window without demand.
        if quiet_s < policy.scaledown_window_s:
            return ScaleDecision(load.workers, "within_scaledown_window")
        reason = "min_workers" if wanted == policy.min_workers else "scale_down_window"
        return ScaleDecision(wanted, reason)
    return ScaleDecision(load.workers, "steady")

"""Warm-pool sizing (pure): how many generic workers to keep booted, per accelerator type.

A pool worker has paid its boot (process start, runtime import, device context) ahead of time,
so a cold start that takes one only loads and warms up. The pool's size covers the cold starts
expected across all deployments over the boot horizon (the time a fresh boot would take,
which is how long a used pool worker takes to be replaced):

    a deployment with no worker needs one at its next arrival:
        P(it arrives within the horizon) = 1 − exp(−rate × horizon)
    expected cold starts μ = Σ of those over the deployments of that accelerator type
    size = the smallest k with P(Poisson(μ) > k) ≤ 1 − COVERAGE, at least 1 while any
           deployment of that type is live (its first call should not pay a boot either)

within the machine's budget: at most `max_workers` in all (PLATFORM_WARM_POOL_MAX; the types
with the most expected cold starts first) and never more than the accelerators of that type not
held by deployments' workers. Deployments that already run workers are not counted: their next
worker is a scale-up, covered by the autoscaler's own pre-warming.

Pool workers run the built-in engine on one accelerator (`serves`): a deployment whose engine
resolved to vllm is never handed one (it boots its own worker, in vLLM's environment, with its
accelerator_count), and its cold starts are not counted here.

A used pool worker is replaced only once no cold start is under way (a boot competes with a
load for the host's cores): no worker boots, loads or warms up, and none was placed less than
REFILL_SETTLE_S ago (the first token follows the load: a warm-pool cold start answers 0.6-1.6 s
after its assignment on 2 cores, and a replacement booting in that time took 0.1-0.15 s of it);
after failed pool boots only after the crash-loop backoff.

>>> targets([Outlook("cpu", capacity=0, arrival_rate_per_s=0.01)], 2.0, Budget(4, {}))
[PoolTarget(accelerator='cpu', size=1, expected_cold_starts=0.0198, reason='floor')]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from common.protocol import WorkerState
from control_plane.domain.crash_loop import BootHistory, backoff_s
from control_plane.domain.fleet import BOOTING_STATES

# Share of the expected cold starts the pool covers without a boot.
COVERAGE = 0.99
# A worker placed (booted, or assigned from the pool) less than this ago is still a cold start.
REFILL_SETTLE_S = 2.0


POOL_ENGINE = "builtin"  # the engine a pool worker boots (`common.messages.Assignment.engine`)


def serves(engine: str) -> bool:
    """Whether a pool worker can take a deployment whose engine resolved to `engine`."""
    return engine == POOL_ENGINE


@dataclass(frozen=True, slots=True)
class Outlook:
    """One live deployment, as the pool sees it."""

    accelerator: str  # the accelerator type its workers need
    capacity: int  # its workers, ready or on their way
    arrival_rate_per_s: float  # expected arrivals per second over the horizon (0: unknown)


@dataclass(frozen=True, slots=True)
class Budget:
    max_workers: int  # pool workers in all (0: no pool)
    # per accelerator type, those not held by deployments' workers; a type absent: no limit
    free_accelerators: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PoolTarget:
    accelerator: str
    size: int  # pool workers to keep
    expected_cold_starts: float  # μ over the horizon
    reason: str  # covers_expected | floor | budget | no_deployments


def expected_cold_starts(outlooks: Iterable[Outlook], horizon_s: float) -> float:
    return sum(
        1.0 - math.exp(-max(o.arrival_rate_per_s, 0.0) * horizon_s)
        for o in outlooks
        if o.capacity == 0
    )


def poisson_quantile(mean: float, coverage: float = COVERAGE) -> int:
    """The smallest k with P(Poisson(mean) ≤ k) ≥ coverage."""
    if mean <= 0:
        return 0
    k, term = 0, math.exp(-mean)
    total = term
    while total < coverage:
        k += 1
        term *= mean / k
        total += term
    return k


def targets(outlooks: Iterable[Outlook], horizon_s: float, budget: Budget) -> list[PoolTarget]:
    """The pool size per accelerator type in use, types sorted by name."""
    by_type: dict[str, list[Outlook]] = {}
    for o in outlooks:
        by_type.setdefault(o.accelerator, []).append(o)
    wanted = []
    for accelerator, group in by_type.items():
        mu = expected_cold_starts(group, horizon_s)
        covering = poisson_quantile(mu)
        size, reason = (covering, "covers_expected") if covering >= 1 else (1, "floor")
        free = budget.free_accelerators.get(accelerator)
        if free is not None and size > free:
            size, reason = max(free, 0), "budget"
        wanted.append(PoolTarget(accelerator, size, round(mu, 4), reason))
    # The machine-wide budget goes to the types expecting the most cold starts first.
    left = budget.max_workers
    out = []
    for t in sorted(wanted, key=lambda t: (-t.expected_cold_starts, t.accelerator)):
        size = min(t.size, left)
        left -= size
        out.append(
            t
            if size == t.size
            else PoolTarget(t.accelerator, size, t.expected_cold_starts, "budget")
        )
    return sorted(out, key=lambda t: t.accelerator)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    start: int  # pool workers to boot now
    stop: int  # pool workers to stop now (booting ones first, then idle)


def cold_start_under_way(serving: Iterable[tuple[WorkerState, datetime]], now: datetime) -> bool:
    """Whether a deployment's worker (state, placed at) is still starting: it boots, loads or
    warms up, or it was placed less than REFILL_SETTLE_S ago (its first jobs run)."""
    settle = timedelta(seconds=REFILL_SETTLE_S)
    return any(s in BOOTING_STATES or now - placed < settle for s, placed in serving)


def plan(
    target: int,
    pooled: int,
    cold_start_under_way: bool,
    history: Callable[[], BootHistory],
    now: datetime,
) -> PoolPlan:
    """Boots or stops that bring one type's pool (`pooled` workers now) toward `target`;
    `history` (the pool's failed boots) is asked only when the pool would grow."""
    if pooled > target:
        return PoolPlan(start=0, stop=pooled - target)
    if pooled == target or cold_start_under_way:
        return PoolPlan(0, 0)
    past = history()
    n = past.consecutive_failures
    if n and past.last_failure_at is not None:
        if (now - past.last_failure_at).total_seconds() < backoff_s(n):
            return PoolPlan(0, 0)
        return PoolPlan(start=1, stop=0)  # after failures: one at a time
    return PoolPlan(start=target - pooled, stop=0)

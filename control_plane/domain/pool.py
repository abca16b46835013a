"""Warm-pool sizing (pure): how many generic workers to keep booted, per accelerator type and
engine.

A pool worker has paid its boot (process start, runtime import, device context) ahead of time,
so a cold start that takes one only loads and warms up. The pool's size covers the cold starts
expected across all deployments over the boot horizon (the time a fresh boot would take,
which is how long a used pool worker takes to be replaced):

    a deployment with no worker needs one at its next arrival:
        P(it arrives within the horizon) = 1 − exp(−rate × horizon)
    expected cold starts μ = Σ of those over the deployments of that accelerator type and
                             engine
    size = the smallest k with P(Poisson(μ) > k) ≤ 1 − COVERAGE, at least 1 while any
           deployment of that type and engine is live (its first call should not pay a boot
           either)

within the machine's budget: at most `max_workers` in all (PLATFORM_WARM_POOL_MAX) and never
more than the accelerators of a type not held by deployments' workers (the pools of its
engines share them), the pools with the most expected cold starts first. Deployments that
already run workers are not counted: their next worker is a scale-up, covered by the
autoscaler's own pre-warming.

A pool worker has one engine (`ENGINES`), prepared at its boot: a built-in one has imported
torch and the engine, a vLLM one vLLM too (its ~8-10 s of imports, in vLLM's environment). It
serves only deployments whose engine resolved to its own (`serves`), so each engine's pool is
sized by its own deployments, over its own horizon (a vLLM boot is longer). A pool worker holds
one accelerator, so only deployments of `accelerator_count` 1 take one (`takes_pool_worker`);
the others (vLLM's tensor parallelism) boot their own and are not counted here. The vLLM pool
exists only on a platform that has vLLM (its python or image): the caller leaves vLLM's
deployments out otherwise.

A used pool worker is replaced only once no cold start is under way (a boot competes with a
load for the host's cores): no worker boots, loads or warms up, and none was placed less than
REFILL_SETTLE_S ago (the first token follows the load: a warm-pool cold start answers 0.6-1.6 s
after its assignment on 2 cores, and a replacement booting in that time took 0.1-0.15 s of it);
after failed pool boots only after the crash-loop backoff.

>>> quiet = [Outlook("cpu", capacity=0, arrival_rate_per_s=0.01, engine="vllm")]
>>> (t,) = targets(quiet, {"vllm": 2.0}, Budget(4, {}))
>>> (t.accelerator, t.engine, t.size, t.expected_cold_starts)
('cpu', 'vllm', 1, 0.0198)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from common.messages import ENGINES
from common.protocol import WorkerState
from control_plane.domain.crash_loop import BootHistory, backoff_s
from control_plane.domain.fleet import BOOTING_STATES

# Share of the expected cold starts the pool covers without a boot.
COVERAGE = 0.99
# A worker placed (booted, or assigned from the pool) less than this ago is still a cold start.
REFILL_SETTLE_S = 2.0


BUILTIN, VLLM = ENGINES  # the engines a pool worker may boot (`Assignment.engine`)


def serves(pool_engine: str, engine: str) -> bool:
    """Whether a pool worker booted for `pool_engine` can take a deployment whose engine
    resolved to `engine`: only its own (it imported that engine and nothing else)."""
    return pool_engine == engine


def takes_pool_worker(accelerator_count: int) -> bool:
    """Whether a deployment's cold start may take a pool worker at all: a pool worker holds one
    accelerator, so a deployment that splits its model over several (vLLM's tensor
    parallelism) boots its own, with all of them."""
    return accelerator_count == 1


@dataclass(frozen=True, slots=True)
class Outlook:
    """One live deployment, as the pool sees it."""

    accelerator: str  # the accelerator type its workers need
    capacity: int  # its workers, ready or on their way
    arrival_rate_per_s: float  # expected arrivals per second over the horizon (0: unknown)
    engine: str = BUILTIN  # the engine it resolved to: its cold starts take that engine's pool


@dataclass(frozen=True, slots=True)
class Budget:
    max_workers: int  # pool workers in all (0: no pool)
    # per accelerator type, those not held by deployments' workers; a type absent: no limit
    free_accelerators: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PoolTarget:
    accelerator: str
    engine: str  # the engine its workers boot (ENGINES)
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


def targets(
    outlooks: Iterable[Outlook], horizons_s: Mapping[str, float], budget: Budget
) -> list[PoolTarget]:
    """The pool size per accelerator type and engine in use, sorted by type, then engine;
    `horizons_s`: per engine, the time a fresh boot of it takes (its pool's refill)."""
    by_pool: dict[tuple[str, str], list[Outlook]] = {}
    for o in outlooks:
        by_pool.setdefault((o.accelerator, o.engine), []).append(o)
    wanted = []
    for (accelerator, engine), group in by_pool.items():
        mu = expected_cold_starts(group, horizons_s[engine])
        covering = poisson_quantile(mu)
        size, reason = (covering, "covers_expected") if covering >= 1 else (1, "floor")
        wanted.append(PoolTarget(accelerator, engine, size, round(mu, 4), reason))
    # The budgets go to the pools expecting the most cold starts first: a type's free
    # accelerators (shared by its engines' pools), then the machine-wide maximum.
    free = dict(budget.free_accelerators)
    left = budget.max_workers
    out = []
    for t in sorted(wanted, key=lambda t: (-t.expected_cold_starts, t.accelerator, t.engine)):
        size, reason = t.size, t.reason
        type_free = free.get(t.accelerator)
        if type_free is not None and size > type_free:
            size, reason = max(type_free, 0), "budget"
        if size > left:
            size, reason = left, "budget"
        left -= size
        if type_free is not None:
            free[t.accelerator] = type_free - size
        out.append(t if size == t.size else replace(t, size=size, reason=reason))
    return sorted(out, key=lambda t: (t.accelerator, t.engine))


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
    """Boots or stops that bring one pool (an accelerator type's workers of one engine;
    `pooled` now) toward `target`; `history` (that pool's failed boots) is asked only when it
    would grow."""
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

"""The policy interface and the baselines the simulator compares ``ours`` with.

Baselines are bench code, written from their published defaults; the platform's own decision
lives in ``control_plane.domain.scaling`` (driven by ``ours.py``). Every policy is called on
the same 2 s tick and answers with the number of workers it wants for one deployment, counted
as ready (non-draining) + booting; the simulator starts or releases the difference.

- ``KeepAlive``: reactive scale-up to ceil(demand / slots); a worker is released after
  ``window_s`` of not being needed (the last one after ``window_s`` without work), each call
  counting as a need on its arrival.
- ``KPA``: Knative's KPA with its defaults (``config-autoscaler``).
- ``KEDA``: KEDA's queue-length scaler feeding the HPA.
- ``Histogram``: the hybrid histogram policy of "Serverless in the Wild" (ATC'20).
- ``oracle.Oracle``: knows the future.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from control_plane.domain.scaling.policy import DEFAULT_BOOT_S

if TYPE_CHECKING:
    from bench.autoscale.sim import DeploymentRuntime, Sim

# A deployment may grow this far: no policy is ever capped by it in these workloads.
MAX_WORKERS = 10_000


class Policy:
    """One autoscaler over every deployment of a run. Subclasses override what they need."""

    name = "base"
    refit_s = 0.0  # period of the off-path refit event (0: the policy has none)

    def attach(self, sim: Sim) -> None:
        """Called once before the run: size per-deployment state."""
        self.slots = sim.slots
        self.t_cold_s = sim.t_cold_s

    def on_arrival(self, dep: DeploymentRuntime, now: float) -> None:
        """A request arrived (before it is queued or placed)."""

    def tick(self, dep: DeploymentRuntime, now: float) -> int | None:
        """Workers wanted now (None: leave the deployment as it is)."""
        return None

    def refit(self, now: float) -> None:
        """The off-path model refresh, every ``refit_s``."""

    def schedule(self, dep: DeploymentRuntime) -> list[tuple[float, int]]:
        """Workers known to be needed before the run (the oracle's): (t, +1) has a worker
        ready at t (started t_cold earlier), (t, -1) releases one at t."""
        return []


def workers_for(demand: float, per_worker: float) -> int:
    return math.ceil(demand / per_worker) if demand > 0 else 0


def mean_boot_s(dep: DeploymentRuntime) -> float:
    """Mean measured start → ready of this deployment's boots (the prior before the first)."""
    return dep.boot_sum_s / dep.boot_count if dep.boot_count else DEFAULT_BOOT_S


def hold_levels(needed_at: list[float], needed: int, now: float, window_s: float) -> int:
    """Per-worker keep-alive: ``needed_at[k]`` is the last time k + 1 workers were needed
    (non-increasing in k); returns how many are still inside the window."""
    for k in range(min(needed, len(needed_at))):
        needed_at[k] = now
    needed_at.extend([now] * (needed - len(needed_at)))
    while needed_at and now - needed_at[-1] >= window_s:
        needed_at.pop()
    return len(needed_at)


class KeepAlive(Policy):
    """Reactive scale-up, fixed keep-alive per worker (the common serverless default)."""

    name = "keepalive"

    def __init__(self, window_s: float = 600.0) -> None:
        self.window_s = window_s

    def attach(self, sim: Sim) -> None:
        super().attach(sim)
        self._needed_at: list[list[float]] = [[] for _ in sim.deployments]

    def on_arrival(self, dep: DeploymentRuntime, now: float) -> None:
        # A keep-alive restarts its clock at each call, however short: sampled at the ticks
        # only, a call that came and went between two was never seen, and the worker it used
        # was released a window after the last call a tick saw.
        self._hold(dep, dep.demand + 1, now)

    def tick(self, dep: DeploymentRuntime, now: float) -> int | None:
        return self._hold(dep, dep.demand, now)

    def _hold(self, dep: DeploymentRuntime, demand: int, now: float) -> int:
        needed = workers_for(demand, self.slots)
        return hold_levels(self._needed_at[dep.index], needed, now, self.window_s)


class KPA(Policy):
    """Knative Pod Autoscaler (knative/serving ``pkg/autoscaler/scaling/autoscaler.go``) with
    the ``config-autoscaler`` defaults: target utilization 70 % of the container concurrency,
    60 s stable window, panic window 10 % of it, panic at 200 %, max scale-down rate 2, scale
    to zero once the stable window has seen no traffic plus a 30 s grace period. Concurrency is
    sampled every tick as queued + running (the activator and queue-proxy both count waiting
    requests)."""

    name = "kpa"

    def __init__(
        self,
        stable_window_s: float = 60.0,
        target_utilization: float = 0.7,
        panic_window_pct: float = 0.1,
        panic_threshold: float = 2.0,
        max_scale_down_rate: float = 2.0,
        scale_to_zero_grace_s: float = 30.0,
    ) -> None:
        self.stable_window_s = stable_window_s
        self.panic_window_s = stable_window_s * panic_window_pct
        self.target_utilization = target_utilization
        self.panic_threshold = panic_threshold
        self.max_scale_down_rate = max_scale_down_rate
        self.grace_s = scale_to_zero_grace_s

    def attach(self, sim: Sim) -> None:
        super().attach(sim)
        self._deps = [_KPAState() for _ in sim.deployments]

    def tick(self, dep: DeploymentRuntime, now: float) -> int | None:
        s = self._deps[dep.index]
        c = dep.demand
        if c:
            s.last_nonzero_at = now
        elif s.last_nonzero_at is None:
            return None  # never called: nothing to scale
        stable = s.stable.add(now, c, self.stable_window_s)
        panic = s.panic.add(now, c, self.panic_window_s)
        target = self.slots * self.target_utilization
        ready = max(dep.ready, 1)
        max_down = math.floor(ready / self.max_scale_down_rate)
        dspc, dppc = workers_for(stable, target), workers_for(panic, target)
        desired_stable, desired_panic = max(dspc, max_down), max(dppc, max_down)
        if dppc / ready >= self.panic_threshold:
            s.panic_at = now  # start or extend panic mode
        elif s.panic_at is not None and s.panic_at + self.stable_window_s < now:
            s.panic_at, s.max_panic = None, 0
        desired = desired_stable
        if s.panic_at is not None:  # in panic the count never goes down
            s.max_panic = max(s.max_panic, desired_panic)
            desired = s.max_panic
        if (
            desired == 0
            and dep.capacity
            and now - s.last_nonzero_at < (self.stable_window_s + self.grace_s)
        ):
            desired = 1
        return desired


class _Window:
    """Sliding mean of tick samples over the last ``window_s``; integer sums stay exact."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, now: float, value: int, window_s: float) -> float:
        self.samples.append((now, value))
        self.total += value
        while self.samples[0][0] <= now - window_s:
            self.total -= self.samples.popleft()[1]
        return self.total / len(self.samples)


class _KPAState:
    def __init__(self) -> None:
        self.stable = _Window()
        self.panic = _Window()
        self.panic_at: float | None = None  # last time the panic threshold was crossed
        self.max_panic = 0
        self.last_nonzero_at: float | None = None


class KEDA(Policy):
    """KEDA's queue-length scaler feeding the HPA: every ``polling_s`` (each deployment on its
    own phase) replicas = ceil(waiting requests / slots); the HPA's default 300 s scale-down
    stabilization keeps the highest recommendation of its window; KEDA keeps ≥ 1 replica
    until the queue has been empty at every poll for ``cooldown_s``, then scales to zero.
    Requests already on a worker are not in the queue length, as with a message queue whose
    in-flight messages are unacknowledged."""

    name = "keda"

    def __init__(
        self, cooldown_s: float = 300.0, polling_s: float = 30.0, stabilization_s: float = 300.0
    ) -> None:
        self.cooldown_s = cooldown_s
        self.polling_s = polling_s
        self.stabilization_s = stabilization_s

    def attach(self, sim: Sim) -> None:
        from bench.autoscale.sim import TICK_S

        super().attach(sim)
        self._every = max(round(self.polling_s / TICK_S), 1)
        self._tick_s = TICK_S
        self._recs: list[deque[tuple[float, int]]] = [deque() for _ in sim.deployments]
        self._active_at: list[float | None] = [None] * len(sim.deployments)

    def tick(self, dep: DeploymentRuntime, now: float) -> int | None:
        if (round(now / self._tick_s) + dep.index) % self._every:
            return None  # not this deployment's poll
        i = dep.index
        queued = len(dep.queue)
        if queued:
            self._active_at[i] = now
        active_at = self._active_at[i]
        if active_at is None:
            return None
        recs = self._recs[i]
        recs.append((now, workers_for(queued, self.slots)))
        while recs[0][0] <= now - self.stabilization_s:
            recs.popleft()
        if now - active_at >= self.cooldown_s:
            return 0
        return max(max(r for _, r in recs), 1)


# The histogram's bins (ATC'20): one minute wide, four hours of range.
BIN_S = 60.0
NUM_BINS = 240


class Histogram(Policy):
    """The hybrid histogram policy of "Serverless in the Wild" (Shahrad et al., ATC'20), alone:
    a per-deployment histogram of idle times (no work in flight → next arrival) in 1-minute bins.
    Once it has ≥ ``min_samples`` samples and is representative (CV of the bin counts > 2), the
    worker is released when the deployment goes idle and booted again at the head percentile
    less 10 %, then kept until the tail percentile plus 10 % of the window; otherwise a plain
    ``fallback_s`` keep-alive. More workers than one are added reactively and each kept for the
    same keep-alive. NOTE: the paper loads at the pre-warm point (its cold starts were short);
    here the boot is started one measured boot earlier, so the worker is ready at that point."""

    name = "histogram"

    def __init__(
        self,
        head_pct: float = 5.0,
        tail_pct: float = 99.0,
        fallback_s: float = 600.0,
        min_samples: int = 10,
        cv_threshold: float = 2.0,
        margin: float = 0.1,
    ) -> None:
        self.head_pct, self.tail_pct = head_pct, tail_pct
        self.fallback_s = fallback_s
        self.min_samples = min_samples
        self.cv_threshold = cv_threshold
        self.margin = margin

    def attach(self, sim: Sim) -> None:
        super().attach(sim)
        n = len(sim.deployments)
        self._bins = [[0] * NUM_BINS for _ in range(n)]
        self._samples = [0] * n
        self._fallback = (0.0, self.fallback_s)
        # (pre-warm, keep-alive end), counted from the start of the idle period
        self._windows = [self._fallback] * n
        self._needed_at: list[list[float]] = [[] for _ in range(n)]

    def on_arrival(self, dep: DeploymentRuntime, now: float) -> None:
        if dep.demand or dep.idle_since is None:
            return
        i = dep.index
        b = min(int((now - dep.idle_since) // BIN_S), NUM_BINS - 1)
        self._bins[i][b] += 1
        self._samples[i] += 1
        self._windows[i] = self._fit(self._bins[i], self._samples[i])

    def _fit(self, bins: list[int], n: int) -> tuple[float, float]:
        if n < self.min_samples:
            return self._fallback
        mean = n / NUM_BINS
        cv = math.sqrt(sum((c - mean) ** 2 for c in bins) / NUM_BINS) / mean
        if cv <= self.cv_threshold:
            return self._fallback
        head = _bin_at(bins, n, self.head_pct) * BIN_S  # lower edge: round down
        tail = (_bin_at(bins, n, self.tail_pct) + 1) * BIN_S  # upper edge: round up
        prewarm = head * (1 - self.margin)
        return prewarm, prewarm + (tail - head) * (1 + self.margin)

    def tick(self, dep: DeploymentRuntime, now: float) -> int | None:
        i = dep.index
        if dep.idle_since is None and not dep.demand:
            return None  # never called yet
        prewarm, end = self._windows[i]
        needed = workers_for(dep.demand, self.slots)
        held = hold_levels(self._needed_at[i], needed, now, end - prewarm)
        if dep.demand:
            first = 1
        else:
            assert dep.idle_since is not None
            idle = now - dep.idle_since
            first = int(prewarm - mean_boot_s(dep) <= idle < end)
        return max(first, held if held >= 2 else 0)


def _bin_at(bins: list[int], n: int, pct: float) -> int:
    """Index of the bin holding the `pct` percentile of `n` samples."""
    rank = pct / 100 * n
    seen = 0
    for i, c in enumerate(bins):
        seen += c
        if seen >= rank and c:
            return i
    return len(bins) - 1

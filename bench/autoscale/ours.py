"""``ours``: the platform's autoscaler, ``control_plane.domain.scaling``, driven as the live
reconciler drives it.

Every tick, per deployment: record queued + running into the deployment's
``ConcurrencyWindow``, build a ``DeploymentState`` from what the simulator observes (booting
workers by start time, measured boot and service means, the most requests present at an
arrival since the last tick, the last refit models, the previous decision's memory), call
``decide(state, now)`` and hand back its desired count (the simulator starts
``decision.start`` workers or drains the surplus). Arrivals go into the deployment's
``ArrivalHistory`` as they arrive; ``refit`` runs off the decision path as its own event.

The domain is called through the ``scaling`` package at call time (``scaling.decide``), so a
test that wraps ``control_plane.domain.scaling.decide`` sees every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.autoscale.policies import MAX_WORKERS, Policy, mean_boot_s
from control_plane.domain import scaling
from control_plane.domain.scaling import (
    ArrivalHistory,
    ConcurrencyWindow,
    DeploymentState,
    Memory,
    Models,
    ScalingPolicy,
)
from control_plane.domain.scaling.models import MAX_MODEL_AGE_S, NONE
from control_plane.domain.scaling.policy import DEFAULT_SERVICE_S
from control_plane.domain.scaling.service import mean_service_s

if TYPE_CHECKING:
    from bench.autoscale.sim import DeploymentRuntime, Sim


@dataclass(slots=True, eq=False)
class _Scaling:
    """What the reconciler keeps per deployment between ticks."""

    history: ArrivalHistory = field(default_factory=ArrivalHistory)
    window: ConcurrencyWindow = field(default_factory=ConcurrencyWindow)
    models: Models = NONE
    memory: Memory = field(default_factory=Memory)
    arrived: bool = False  # arrivals since the last refit
    # the most requests present at an arrival since the last tick (the live `arrivals` peak)
    peak: int = 0


# The deployment's scale-down window here: keep-alive 10 min's, the baseline it is judged by.
WINDOW_S = 600.0
# ... and the price of a caller's wait through a boot: that window. An owner who keeps an unneeded
# worker for the window on the chance of a call prices a cold start at the window (keeping for
# exactly the price of a cold start is the ski-rental rule); the platform's defaults keep the
# same relation (a 60 s window, a 60 s price).
PENALTY_S = WINDOW_S


class Ours(Policy):
    """``decide`` with the simulator's slots as target concurrency, keep-alive capped at
    ``scaledown_window_s`` (WINDOW_S) and cold starts priced at it (PENALTY_S).

    Refit: every ``refit_s`` a deployment with arrivals since its last fit is refit. NOTE: one
    exception to "only after arrivals": models older than ``MAX_MODEL_AGE_S`` are ignored by
    ``decide`` (it treats them as a dead refresher), so a deployment quiet for longer than that
    would lose its pre-warm exactly when it is due; it is refit once more just before its models
    would expire (``refresh_quiet`` turns this off, to see the difference)."""

    name = "ours"

    def __init__(
        self,
        cold_penalty_s: float = PENALTY_S,
        scaledown_window_s: float = WINDOW_S,
        refit_s: float = 10.0,
        refresh_quiet: bool = True,
        record_every: int = 0,
        queue_wait_s: float = ScalingPolicy().queue_wait_s,
    ) -> None:
        self.cold_penalty_s = cold_penalty_s
        self.scaledown_window_s = scaledown_window_s
        self.refit_s = refit_s
        self.refresh_quiet = refresh_quiet
        self.queue_wait_s = queue_wait_s
        # every `record_every`-th tick, keep all deployments' states (for timing decide)
        self.record_every = record_every
        self.recorded: list[tuple[float, list[DeploymentState]]] = []
        self.decide_calls = 0
        self.refits = 0

    def attach(self, sim: Sim) -> None:
        super().attach(sim)
        self.policy = ScalingPolicy(
            min_workers=0,
            max_workers=MAX_WORKERS,
            target_concurrency=sim.slots,
            scaledown_window_s=self.scaledown_window_s,
            cold_penalty_s=self.cold_penalty_s,
            queue_wait_s=self.queue_wait_s,
        )
        self._deps = [_Scaling() for _ in sim.deployments]
        self._runtimes = sim.deployments
        self._tick_index = -1
        self._tick_at = float("nan")

    def on_arrival(self, dep: DeploymentRuntime, now: float) -> None:
        s = self._deps[dep.index]
        s.history.record(now)
        s.arrived = True
        # (the simulator counts the request in its queue after this call)
        s.peak = max(s.peak, dep.demand + 1)

    def refit(self, now: float) -> None:
        expires = MAX_MODEL_AGE_S - self.refit_s  # refit before the next event would be too late
        for dep, s in zip(self._runtimes, self._deps, strict=True):
            stale = (
                self.refresh_quiet
                and s.models is not NONE
                and now - s.models.fitted_at >= expires
                and s.history.last_arrival_at is not None
            )
            # A forecast extrapolates from its fit: one fitted at a burst's end and kept
            # through the silence after it asked for more workers as its trend ran on. The live
            # refresher refits every deployment every few seconds, silence included.
            forecasting = s.models.forecast is not None
            if s.arrived or stale or forecasting:
                s.models = scaling.refit(
                    s.history.stats(now), self.policy, mean_boot_s(dep), _service_s(dep, now)
                )
                s.arrived = False
                self.refits += 1

    def tick(self, dep: DeploymentRuntime, now: float) -> int | None:
        s = self._deps[dep.index]
        s.window.record(now, dep.demand)
        stable, panic = s.window.averages(now)
        state = DeploymentState(
            policy=self.policy,
            queued=len(dep.queue),
            running=dep.running,
            ready=dep.ready,
            booting_since=tuple(w.started_at for w in dep.workers if not w.ready),
            stable_concurrency=stable,
            panic_concurrency=panic,
            last_arrival_at=s.history.last_arrival_at,
            boot_s=mean_boot_s(dep),
            service_s=_service_s(dep, now),
            models=s.models,
            memory=s.memory,
            peak_demand=max(s.peak, dep.demand),
        )
        s.peak = 0  # as each live tick sets it to the work present
        decision = scaling.decide(state, now)
        self.decide_calls += 1
        s.memory = decision.memory
        if self.record_every:
            self._record(state, now)
        # NOTE: the simulator's capacity is decide's (every boot is shorter than max_boot_s)
        assert decision.capacity == dep.capacity, (decision.capacity, dep.capacity)
        return decision.desired

    def _record(self, state: DeploymentState, now: float) -> None:
        if now != self._tick_at:
            self._tick_at = now
            self._tick_index += 1
            if self._tick_index % self.record_every == 0:
                self.recorded.append((now, []))
        if self._tick_index % self.record_every == 0:
            self.recorded[-1][1].append(state)


def _service_s(dep: DeploymentRuntime, now: float) -> float:
    """As the live refresher measures it (`scaling.service`), on the simulated completions."""
    measured = mean_service_s(reversed(dep.ended), now)
    return DEFAULT_SERVICE_S if measured is None else measured

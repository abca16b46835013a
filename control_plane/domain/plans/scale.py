"""The scaling plan of one deployment for one tick, from the autoscaler's decision
(`scaling.decide`, made once per tick) and, when it would start workers, the crash-loop gate's
verdict on the deployment version's recent boots:

    drain       workers of an older version (they finish what they hold)
    fail        the waiting jobs, when its workers keep failing (crash loop)
    start       the workers the decision wants, each from the idle warm pool when placement
                says that is faster, else a new boot
    hold        the waiting jobs `starting` with the gate's reason (announced when held back)
    scale down  the surplus, idle first, busy last, never more than the decision allows

Workers of deleted deployments drain (`plan_orphans`).

`document` is the decision as the API shows it (`api/schemas.py::ScalingStatus`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from common.protocol import WorkerState
from control_plane.domain import fleet, pool
from control_plane.domain.clock import iso
from control_plane.domain.crash_loop import BootHistory, StartVerdict, may_start
from control_plane.domain.placement import Estimates, PoolCandidate, place
from control_plane.domain.plans.actions import (
    Action,
    FailWaiting,
    HoldWaiting,
    StartWorker,
    StopWorker,
)
from control_plane.domain.scaling.decide import (
    DeploymentState,
    ScaleDecision,
    counts_as_capacity,
    gate,
    keepalive_levels,
)
from control_plane.domain.scaling.levels import hold_levels_s
from control_plane.domain.scaling.models import NONE
from control_plane.domain.scaling.policy import ScalingPolicy, counted_boot_s, waits_allowed


@dataclass(frozen=True, slots=True)
class DeploymentView:
    """A live deployment as its plan needs it."""

    id: str
    name: str
    version: int  # its current spec version
    engine: str = "builtin"  # the engine it resolved to: builtin | vllm
    accelerator_count: int = 1  # accelerators per worker (a pool worker holds one)


@dataclass(frozen=True, slots=True)
class DeploymentWorker:
    """A live worker of the deployment."""

    id: str
    state: WorkerState
    version: int  # the spec version it was started for
    reason: str | None  # why it was started, or asked to stop
    started_at: float  # seconds since the epoch

    def view(self) -> fleet.WorkerView:
        return fleet.WorkerView(self.id, self.state, self.version, self.reason)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The deployment's workers as this tick counts them."""

    ready: list[DeploymentWorker]  # of the current version, serving
    booting: list[DeploymentWorker]  # of the current version, not ready yet
    to_drain: list[DeploymentWorker]  # of an older version, not yet asked to stop


def split(workers: Sequence[DeploymentWorker], version: int) -> Fleet:
    views = [w.view() for w in workers]
    drain = {v.id for v in fleet.to_drain(views, version)}
    active = {v.id for v in fleet.capacity(views, version)}
    return Fleet(
        ready=[w for w in workers if w.id in active and w.state in fleet.READY_STATES],
        booting=[w for w in workers if w.id in active and w.state in fleet.BOOTING_STATES],
        to_drain=[w for w in workers if w.id in drain],
    )


@dataclass(frozen=True, slots=True)
class ScalePlan:
    decision: ScaleDecision  # after the crash-loop gate
    actions: list[Action]  # in the order they apply
    # whether its waiting jobs hear of a cold start this tick (not when they fail)
    reports_cold_start: bool


def plan_scale(
    dep: DeploymentView,
    workers: Fleet,
    state: DeploymentState,
    decision: ScaleDecision,
    history: BootHistory | None,
    candidates: Sequence[PoolCandidate],
    est: Estimates,
    now: datetime,
) -> ScalePlan:
    """What to do for `dep` this tick. `history`: its version's recent boots, read only when
    `decision` starts workers (None otherwise); `candidates`: the idle pool workers of its
    accelerator type and engine, each taken at most once, and none by a deployment whose
    workers need more than the one accelerator a pool worker holds
    (`pool.takes_pool_worker`: it boots its own)."""
    actions: list[Action] = [StopWorker(w.id, dep.id, fleet.NEW_VERSION) for w in workers.to_drain]
    assert not decision.start or history is not None, "a plan that starts workers reads history"
    verdict: StartVerdict | None = None
    if decision.start and history is not None:
        verdict = may_start(history, now)
        if not verdict.start:
            work_present = state.queued + state.running > 0
            decision = gate(
                decision, start_allowed=False, give_up=verdict.give_up, work_present=work_present
            )
    if decision.fail_waiting:
        assert history is not None
        actions.append(FailWaiting(dep.id, dep.name, crash_loop_error(dep, history)))
    elif verdict is not None:
        free = list(candidates) if pool.takes_pool_worker(dep.accelerator_count) else []
        for _ in range(decision.start):
            placement = place(free, est)
            free = [c for c in free if c.worker_id != placement.worker_id]
            actions.append(StartWorker(dep.id, decision.reason, placement))
        if not decision.start:  # held back by the crash-loop gate: they wait, saying why
            actions.append(HoldWaiting(dep.id, verdict.reason, announce=True))
        elif workers.ready:  # more capacity next to serving workers: no cold start to tell
            actions.append(HoldWaiting(dep.id, verdict.reason, announce=False))
    if decision.desired < decision.capacity:
        t = now.timestamp()
        counted = [w.view() for w in workers.ready] + [
            w.view() for w in workers.booting if counts_as_capacity(w.started_at, t, state.policy)
        ]
        for v in fleet.scale_down_victims(counted, decision.desired):
            # NOTE: a stop is a drain (SIGTERM): the worker finishes the jobs it holds first.
            actions.append(StopWorker(v.id, dep.id, fleet.SCALE_DOWN))
    return ScalePlan(decision, actions, reports_cold_start=not decision.fail_waiting)


def plan_orphans(
    workers: Sequence[tuple[str, str, WorkerState]], live_ids: set[str]
) -> list[StopWorker]:
    """Workers (id, deployment id, state) of deployments that were deleted drain and exit."""
    return [
        StopWorker(worker_id, dep_id, fleet.DEPLOYMENT_DELETED)
        for worker_id, dep_id, state in workers
        if dep_id not in live_ids and state != WorkerState.DRAINING
    ]


def crash_loop_error(dep: DeploymentView, history: BootHistory) -> dict[str, Any]:
    """What the jobs of a deployment in a crash loop fail with."""
    return {
        "type": "deployment_unavailable",
        "message": (
            f"{history.consecutive_failures} workers of deployment '{dep.name}' (version "
            f"{dep.version}) failed in a row (last: {history.last_reason or 'unknown'}); check "
            "its model URI and worker logs, then update the deployment"
        ),
    }


def document(state: DeploymentState, d: ScaleDecision, now: datetime) -> dict[str, Any]:
    """The decision as the API shows it (`api/schemas.py::ScalingStatus`)."""
    # NOTE: the models as the refresher last fitted them; decide() may set old ones aside
    # (`models_fitted_at` shows their age).
    models = state.models
    idle = models.idle
    policy: ScalingPolicy = state.policy
    boot_s = counted_boot_s(policy, state.boot_s)
    forecast = None
    if models.forecast is not None:
        mean, sd = models.forecast.rate(now.timestamp())
        forecast = {
            "rate_per_s": round(mean, 6),
            "rate_sd_per_s": round(sd, 6),
            "steady": models.forecast.steady,
        }
    levels = keepalive_levels(idle, policy, boot_s, state.service_s)
    return {
        "desired": d.desired,
        "actual": d.capacity,
        "ready": state.ready,
        "needed": d.needed,
        "reason": d.reason,
        "next_prewarm_at": iso_s(d.next_prewarm_at),
        "decided_at": iso(now),
        "queued": state.queued,
        "running": state.running,
        "boot_s": round(state.boot_s, 3),
        "service_s": round(state.service_s, 3),
        "may_wait": round(waits_allowed(policy, state.ready, boot_s, state.service_s), 3),
        "backlog_workers": d.backlog_workers,
        "holds_s": [round(h, 3) for h in hold_levels_s(d.memory.levels, boot_s, policy)],
        "idle_windows": {
            "representative": idle.representative,
            "prewarm_s": None if idle.prewarm_s is None else round(idle.prewarm_s, 3),
            "keepalive_s": round(levels[0], 3),
            "wake_requests": round(idle.wake_requests, 3),
            "keepalive_levels_s": [round(w, 3) for w in levels],
        },
        "forecast": forecast,
        "recent_rate_per_s": None if models.recent_rate is None else round(models.recent_rate, 6),
        "models_fitted_at": iso_s(models.fitted_at) if models is not NONE else None,
    }


def iso_s(t: float | None) -> str | None:
    return None if t is None else iso(datetime.fromtimestamp(t, UTC))

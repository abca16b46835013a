"""The scaling reconciler, each tick, for every live deployment at once:

    read     work and workers from SQL, the last arrivals (one round trip) and the peaks of
             the work in flight between ticks (two) from Redis, and the models and measured
             times the refresher thread keeps (`refresh.py`): nothing is fitted here
    decide   the pure `domain.scaling.decide()`, once per deployment
    read     the crash-loop gate's input (the version's recent boots) and the model's location
             (for placement), only for the deployments whose decision starts workers
    plan     `domain/plans/scale.py`: drains, starts (from the warm pool when faster), holds,
             failures, scale-downs
    act      the actuator (`actuator.py`); then the cold starts under way are reported to the
             jobs that wait (`cold_starts.py`) and each decision is stored for the API
             (`services/scaling/scale_decisions.py`), logged when its (desired, reason) changed

Workers of deleted deployments are drained (`stop_deleted`).

`Demand` is what this process remembers between ticks: the KPA concurrency windows and the
autoscaler's `Memory`. After a restart both start empty (the arrival history, in Redis, stays).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from sqlalchemy.orm import Session

from common.protocol import WorkerState
from control_plane.db.models import Deployment, Worker
from control_plane.domain.cold_start import ColdStart, PhaseTimes
from control_plane.domain.crash_loop import BootHistory
from control_plane.domain.placement import Estimates
from control_plane.domain.plans.actions import StartWorker
from control_plane.domain.plans.scale import (
    DeploymentView,
    DeploymentWorker,
    Fleet,
    document,
    iso_s,
    plan_orphans,
    plan_scale,
    split,
)
from control_plane.domain.scaling.decide import DeploymentState, Memory, ScaleDecision, decide
from control_plane.domain.scaling.history import ConcurrencyWindow
from control_plane.domain.scaling.models import NONE
from control_plane.domain.scaling.policy import DEFAULT_BOOT_S, DEFAULT_SERVICE_S
from control_plane.errors import InvalidRequest
from control_plane.reconcile import cold_starts
from control_plane.reconcile import pool as warm_pool
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.reconcile.refresh import Measured
from control_plane.services import deployments
from control_plane.services.jobs import job_queries
from control_plane.services.scaling import arrivals, scale_decisions
from control_plane.services.storage import storage_access
from control_plane.services.workers import boot_history, worker_records

log = logging.getLogger(__name__)


@dataclass
class Demand:
    """Per deployment id: what the autoscaler carries from one tick to the next."""

    windows: dict[str, ConcurrencyWindow] = field(default_factory=dict)  # KPA samples
    memory: dict[str, Memory] = field(default_factory=dict)  # the last decision's .memory
    logged: dict[str, tuple[int, str]] = field(default_factory=dict)  # last (desired, reason)
    # the last arrivals read from Redis, used while Redis does not answer
    last_arrival_at: dict[str, float | None] = field(default_factory=dict)
    cold_starts: dict[str, ColdStart] = field(default_factory=dict)  # what waiting jobs were told
    # what each deployment's cold-start key says, and when it was written
    cold_start_keys: dict[str, tuple[ColdStart, float]] = field(default_factory=dict)
    model_bytes: dict[str, int] = field(default_factory=dict)  # weight bytes seen loading
    # the last placement of a worker (its choice, every option's ETA), shown with the decision
    placements: dict[str, dict[str, Any]] = field(default_factory=dict)
    written: scale_decisions.Written = field(default_factory=scale_decisions.Written)

    def forget_all_but(self, live_ids: set[str]) -> None:
        tables: tuple[dict[str, Any], ...] = (
            self.windows,
            self.memory,
            self.logged,
            self.last_arrival_at,
            self.cold_starts,
            self.cold_start_keys,
            self.model_bytes,
            self.placements,
            self.written.docs,
        )
        for table in tables:
            for dep_id in set(table) - live_ids:
                del table[dep_id]


@dataclass(frozen=True, slots=True)
class _Decided:
    """One deployment after `decide`, before its plan."""

    dep: Deployment
    rows: dict[str, Worker]  # its live workers by id
    fleet: Fleet
    state: DeploymentState
    decision: ScaleDecision


def scale_all(
    session: Session,
    env: Env,
    demand: Demand,
    measured: Callable[[str], Measured | None],
    now: datetime,
) -> None:
    """One decision per live deployment, planned and applied; `measured`: the refresher's
    snapshot of one."""
    load = job_queries.load_by_deployment(session)
    live = deployments.list_live(session)
    last_arrivals = _last_arrivals(env.redis, demand, [d.id for d in live])
    peaks = _peaks(env.redis, {d.id: sum(load.get(d.id, (0, 0, None))[:2]) for d in live})
    # Read for every deployment at once (set-based: a tick's queries do not grow with them).
    workers_of: dict[str, list[Worker]] = {}
    for w in worker_records.live(session):
        if w.deployment_id is not None:
            workers_of.setdefault(w.deployment_id, []).append(w)
    t = now.timestamp()
    decided = []
    for dep in live:
        rows = workers_of.get(dep.id, [])
        fleet = split([_worker(w) for w in rows], dep.version)
        queued, running, _ = load.get(dep.id, (0, 0, None))
        window = demand.windows.setdefault(dep.id, ConcurrencyWindow())
        window.record(t, queued + running)
        last_arrival_at = last_arrivals.get(dep.id)
        state = _state(dep, queued, running, fleet, window, measured(dep.id), demand, t)
        state = dataclasses.replace(
            state, last_arrival_at=last_arrival_at, peak_demand=peaks.get(dep.id, 0)
        )
        decided.append(_Decided(dep, {w.id: w for w in rows}, fleet, state, decide(state, t)))
    free = (
        warm_pool.read_free(session, env.redis) if any(d.decision.start for d in decided) else None
    )
    published, cases = [], []
    for d in decided:
        doc, case = _plan_and_act(session, env, demand, d, measured(d.dep.id), free, now)
        published.append((d.dep.id, doc))
        if case is not None:
            cases.append(case)
    cold_starts.report_all(session, env, cases, demand.cold_starts, demand.cold_start_keys, now)
    for c in cases:
        told = demand.cold_starts.get(c.deployment_id)
        if told is not None and told.bytes_total:
            demand.model_bytes[c.deployment_id] = told.bytes_total
    demand.forget_all_but({d.id for d in live})
    session.commit()
    scale_decisions.publish(env.redis, published, demand.written, now.timestamp())


def _plan_and_act(
    session: Session,
    env: Env,
    demand: Demand,
    d: _Decided,
    measured: Measured | None,
    free: warm_pool.FreePool | None,
    now: datetime,
) -> tuple[dict[str, Any], cold_starts.Case | None]:
    """Plan one deployment's tick (reading what only a start needs) and apply it; its
    decision's document, and its cold-start report's case (None when its jobs fail)."""
    dep = d.dep
    times = measured.phase_times if measured else PhaseTimes()
    history: BootHistory | None = None
    candidates = []
    if d.decision.start:
        # The crash-loop gate's input and the model's place, read only when workers would start.
        history = boot_history.boot_history(session, dep.id, dep.version)
        if free is not None:
            candidates = free.candidates(
                dep.spec.accelerator, dep.engine_resolved, _model_uri(session, env, dep)
            )
    est = Estimates(times.boot_s, times.load_s, times.warm_s, demand.model_bytes.get(dep.id))
    view = DeploymentView(
        dep.id, dep.name, dep.version, dep.engine_resolved, dep.spec.accelerator_count
    )
    plan = plan_scale(view, d.fleet, d.state, d.decision, history, candidates, est, now)
    if free is not None:
        free.taken(
            {
                x.placement.worker_id
                for x in plan.actions
                if isinstance(x, StartWorker) and x.placement.worker_id is not None
            }
        )
    demand.memory[dep.id] = plan.decision.memory
    _log_change(demand, dep, plan.decision)
    act = Actuator(session, env, now)
    if plan.actions:
        act.apply(plan.actions)
        act.commit()
    if dep.id in act.placements:
        demand.placements[dep.id] = act.placements[dep.id]
    case = None
    if plan.reports_cold_start:
        booting = [d.rows[w.id] for w in d.fleet.booting] + act.started.get(dep.id, [])
        case = cold_starts.Case(dep.id, booting, len(d.fleet.ready), times)
    doc = document(d.state, plan.decision, now)
    doc["placement"] = demand.placements.get(dep.id)
    return doc, case


def stop_deleted(session: Session, env: Env, now: datetime) -> None:
    """Workers whose deployment was deleted drain and exit."""
    live_ids = {d.id for d in deployments.list_live(session)}
    workers = [
        (w.id, w.deployment_id, WorkerState(w.state))
        for w in worker_records.live(session)
        if w.deployment_id is not None  # not the warm pool's (reconcile/pool.py)
    ]
    act = Actuator(session, env, now)
    act.apply(plan_orphans(workers, live_ids))
    act.commit()


def _worker(w: Worker) -> DeploymentWorker:
    return DeploymentWorker(
        w.id, WorkerState(w.state), w.deployment_version, w.reason, w.started_at.timestamp()
    )


def _state(
    dep: Deployment,
    queued: int,
    running: int,
    fleet: Fleet,
    window: ConcurrencyWindow,
    measured: Measured | None,
    demand: Demand,
    t: float,
) -> DeploymentState:
    stable, panic = window.averages(t)
    return DeploymentState(
        policy=dep.spec.scaling_policy(),
        queued=queued,
        running=running,
        ready=len(fleet.ready),
        booting_since=tuple(w.started_at for w in fleet.booting),
        stable_concurrency=stable,
        panic_concurrency=panic,
        last_arrival_at=None,
        boot_s=measured.boot_s if measured else DEFAULT_BOOT_S,
        service_s=measured.service_s if measured else DEFAULT_SERVICE_S,
        models=measured.models if measured else NONE,
        memory=demand.memory.get(dep.id, Memory()),
    )


def _model_uri(session: Session, env: Env, dep: Deployment) -> str:
    """Where the deployment's model is, as a worker reads it (the pool's host tiers are keyed
    by it); as written when its tenant can no longer read it (the start then says why)."""
    try:
        return storage_access.resolve(session, env.settings, dep.tenant_id, dep.spec.model).uri
    except InvalidRequest:
        return dep.spec.model


def _last_arrivals(r: redis.Redis, demand: Demand, ids: list[str]) -> dict[str, float | None]:
    """The latest arrival of each deployment; while Redis does not answer, the last ones read
    (a missing arrival would read as "never called" and release every warm worker)."""
    try:
        demand.last_arrival_at.update(arrivals.last_arrivals(r, ids))
    except redis.RedisError as exc:
        log.warning("last arrivals unreadable (Redis: %s); using the previous ones", exc)
    return {i: demand.last_arrival_at.get(i) for i in ids}


def _peaks(r: redis.Redis, in_flight: dict[str, int]) -> dict[str, int]:
    """The most jobs each deployment had in flight at an admission since the last tick (the
    work present alone while Redis does not answer: the levels then follow the ticks' counts)."""
    try:
        return arrivals.take_peaks(r, in_flight)
    except redis.RedisError as exc:
        log.warning("peaks in flight unreadable (Redis: %s); using the work present", exc)
        return {}


def _log_change(demand: Demand, dep: Deployment, d: ScaleDecision) -> None:
    if demand.logged.get(dep.id) == (d.desired, d.reason):
        return
    demand.logged[dep.id] = (d.desired, d.reason)
    log.info(
        "scale %s (%s): desired %d, actual %d, reason %s, next pre-warm %s",
        dep.name,
        dep.id,
        d.desired,
        d.capacity,
        d.reason,
        iso_s(d.next_prewarm_at) or "none",
        extra={"deployment_id": dep.id, "reason": d.reason},
    )

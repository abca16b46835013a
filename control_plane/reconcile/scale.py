"""The scaling reconciler: per live deployment and tick, drain workers of an old version, build
the autoscaler's `DeploymentState`, ask the pure `domain.scaling.decide()` how many workers to
run, then start workers, drain the surplus, or in a crash loop fail the jobs that wait (through
`services.jobs.finish`). Workers of deleted deployments are drained.

The tick only reads: work and workers from SQL, the last arrivals from Redis (one round trip), and
the models and measured times the refresher thread keeps (`refresh.py`); nothing is fitted here.
Each decision is stored for the API (`services/scaling/scale_decisions.py`), and logged when its
(desired, reason) changed.

`Demand` is what this process remembers between ticks: the KPA concurrency windows and the
autoscaler's `Memory`. After a restart both start empty (the arrival history, in Redis, stays).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy.orm import Session

from common import tracing
from common.messages import Assignment
from common.protocol import EventType, WorkerState, deployment_queue
from control_plane.db.models import Deployment, Worker
from control_plane.domain import fleet
from control_plane.domain.clock import iso
from control_plane.domain.cold_start import ColdStart, PhaseTimes
from control_plane.domain.crash_loop import BootHistory, may_start
from control_plane.domain.placement import Estimates, Placement, place
from control_plane.domain.scaling.decide import (
    DeploymentState,
    Memory,
    ScaleDecision,
    counts_as_capacity,
    decide,
    keepalive_levels,
)
from control_plane.domain.scaling.history import ConcurrencyWindow
from control_plane.domain.scaling.levels import hold_levels_s
from control_plane.domain.scaling.models import NONE
from control_plane.domain.scaling.policy import (
    DEFAULT_BOOT_S,
    DEFAULT_SERVICE_S,
    counted_boot_s,
    waits_allowed,
)
from control_plane.errors import InvalidRequest
from control_plane.metrics import families, on_commit
from control_plane.providers.base import WorkerSpec
from control_plane.reconcile import cold_starts, tick_trace
from control_plane.reconcile import pool as warm_pool
from control_plane.reconcile.env import Env
from control_plane.reconcile.refresh import Measured
from control_plane.services import deployments
from control_plane.services.jobs import events, finish, job_queries, job_store
from control_plane.services.scaling import arrivals, scale_decisions
from control_plane.services.storage import storage_access
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)
READY_STATES = worker_records.READY_STATES  # serving: idle or busy


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


def scale_all(
    session: Session,
    env: Env,
    demand: Demand,
    measured: Callable[[str], Measured | None],
    now: datetime,
) -> None:
    """One decision per live deployment; `measured`: the refresher's snapshot of one."""
    load = job_queries.load_by_deployment(session)
    live = deployments.list_live(session)
    last_arrivals = _last_arrivals(env.redis, demand, [d.id for d in live])
    free = warm_pool.read_free(session, env.redis)
    # Read for every deployment at once (set-based: a tick's queries do not grow with them).
    workers_of: dict[str, list[Worker]] = {}
    for w in worker_records.live(session):
        if w.deployment_id is not None:
            workers_of.setdefault(w.deployment_id, []).append(w)
    published = []
    cases: list[cold_starts.Case] = []
    for dep in live:
        _, doc = scale(
            session,
            env,
            dep,
            load.get(dep.id, (0, 0, None)),
            demand,
            measured(dep.id),
            last_arrivals.get(dep.id),
            now,
            free,
            workers_of.get(dep.id, []),
            cases,
        )
        published.append((dep.id, doc))
    cold_starts.report_all(session, env, cases, demand.cold_starts, demand.cold_start_keys, now)
    for c in cases:
        told = demand.cold_starts.get(c.deployment_id)
        if told is not None and told.bytes_total:
            demand.model_bytes[c.deployment_id] = told.bytes_total
    demand.forget_all_but({d.id for d in live})
    session.commit()
    scale_decisions.publish(env.redis, published, demand.written, now.timestamp())


def scale(
    session: Session,
    env: Env,
    dep: Deployment,
    load: tuple[int, int, datetime | None],
    demand: Demand,
    measured: Measured | None,
    last_arrival_at: float | None,
    now: datetime,
    free: warm_pool.FreePool | None,
    live: list[Worker],
    cases: list[cold_starts.Case],
) -> tuple[ScaleDecision, dict[str, Any]]:
    """Decide for one deployment and act on it (a worker it needs comes from `free`, the idle
    warm pool, when that is faster); returns the decision and its document. `live` are its
    live workers; its cold-start report, made for all deployments at once after this, is
    added to `cases`."""
    queued, running, _ = load
    t = now.timestamp()
    views = [_view(w) for w in live]
    for w in fleet.to_drain(views, dep.version):
        log.info(
            "draining worker %s of %s: new version",
            w.id,
            dep.name,
            extra={"worker_id": w.id, "deployment_id": dep.id, "reason": fleet.NEW_VERSION},
        )
        _stop(session, env, w.id, fleet.NEW_VERSION)
    spec = dep.spec
    active_ids = {v.id for v in fleet.capacity(views, dep.version)}
    ready = [w for w in live if w.id in active_ids and w.state in READY_STATES]
    booting = [w for w in live if w.id in active_ids and w.state in fleet.BOOTING_STATES]

    window = demand.windows.setdefault(dep.id, ConcurrencyWindow())
    window.record(t, queued + running)
    stable, panic = window.averages(t)
    state = DeploymentState(
        policy=spec.scaling_policy(),
        queued=queued,
        running=running,
        ready=len(ready),
        booting_since=tuple(w.started_at.timestamp() for w in booting),
        stable_concurrency=stable,
        panic_concurrency=panic,
        last_arrival_at=last_arrival_at,
        boot_s=measured.boot_s if measured else DEFAULT_BOOT_S,
        service_s=measured.service_s if measured else DEFAULT_SERVICE_S,
        models=measured.models if measured else NONE,
        memory=demand.memory.get(dep.id, Memory()),
    )
    decision = decide(state, t)
    history, verdict = None, None
    started: list[Worker] = []
    if decision.start:
        # The crash-loop gate is read only when workers would start (it costs queries).
        history = worker_records.boot_history(session, dep.id, dep.version)
        verdict = may_start(history, now)
        if not verdict.start:
            gated = dataclasses.replace(state, start_allowed=False, give_up=verdict.give_up)
            decision = decide(gated, t)
    demand.memory[dep.id] = decision.memory
    _log_change(demand, dep, decision)

    if decision.fail_waiting:
        assert history is not None
        _fail_waiting(session, env, dep, history, now)
    elif verdict is not None:
        times = measured.phase_times if measured else PhaseTimes()
        est = Estimates(times.boot_s, times.load_s, times.warm_s, demand.model_bytes.get(dep.id))
        for _ in range(decision.start):
            new, placement = _start(session, env, dep, decision.reason, free, est, now)
            started.append(new)
            count = functools.partial(families.cold_start, new.accelerator, placement.choice)
            on_commit.after_commit(session, count)  # by tier: pool_host_tier, pool or boot
            demand.placements[dep.id] = {
                "choice": placement.choice,
                "worker_id": new.id,
                "eta_s": placement.eta_s,
                "options": {o.choice: o.eta_s for o in placement.options},
                "at": iso(now),
            }
        session.commit()
        # With none ready, the cold-start report below tells the waiting jobs (phase, ETA).
        if not started:  # held back by the crash-loop gate: they wait, saying why
            waiting = [w.id for w in job_store.mark_starting(session, dep.id, verdict.reason)]
            events.publish_many(env.redis, waiting, EventType.STARTING, {"reason": verdict.reason})
        elif ready:  # more capacity on its way next to serving workers: no cold start to tell
            job_store.mark_starting(session, dep.id, verdict.reason)
    if decision.desired < decision.capacity:
        counted = [_view(w) for w in ready] + [
            _view(w)
            for w in booting
            if counts_as_capacity(w.started_at.timestamp(), t, state.policy)
        ]
        for v in fleet.scale_down_victims(counted, decision.desired):
            # NOTE: a stop is a drain (SIGTERM): the worker finishes the jobs it holds first.
            log.info(
                "scaling down worker %s of %s (%s)",
                v.id,
                dep.name,
                decision.reason,
                extra={"worker_id": v.id, "deployment_id": dep.id, "reason": decision.reason},
            )
            _stop(session, env, v.id, fleet.SCALE_DOWN)
    if not decision.fail_waiting:
        times = measured.phase_times if measured else PhaseTimes()
        cases.append(cold_starts.Case(dep.id, booting + started, len(ready), times))
    doc = _document(state, decision, now)
    doc["placement"] = demand.placements.get(dep.id)
    return decision, doc


def stop_deleted(session: Session, env: Env) -> None:
    """Workers whose deployment was deleted drain and exit."""
    live_ids = {d.id for d in deployments.list_live(session)}
    for w in worker_records.live(session):
        if w.deployment_id is None:  # the warm pool's (reconcile/pool.py)
            continue
        if w.deployment_id not in live_ids and w.state != WorkerState.DRAINING:
            _stop(session, env, w.id, fleet.DEPLOYMENT_DELETED)
    session.commit()


def _last_arrivals(r: redis.Redis, demand: Demand, ids: list[str]) -> dict[str, float | None]:
    """The latest arrival of each deployment; while Redis does not answer, the last ones read
    (a missing arrival would read as "never called" and release every warm worker)."""
    try:
        demand.last_arrival_at.update(arrivals.last_arrivals(r, ids))
    except redis.RedisError as exc:
        log.warning("last arrivals unreadable (Redis: %s); using the previous ones", exc)
    return {i: demand.last_arrival_at.get(i) for i in ids}


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
        _iso_s(d.next_prewarm_at) or "none",
        extra={"deployment_id": dep.id, "reason": d.reason},
    )


def _document(state: DeploymentState, d: ScaleDecision, now: datetime) -> dict[str, Any]:
    """The decision as the API shows it (`api/schemas.py::ScalingStatus`)."""
    # NOTE: the models as the refresher last fitted them; decide() may set old ones aside
    # (`models_fitted_at` shows their age).
    models = state.models
    idle = models.idle
    boot_s = counted_boot_s(state.policy, state.boot_s)
    forecast = None
    if models.forecast is not None:
        mean, sd = models.forecast.rate(now.timestamp())
        forecast = {"rate_per_s": round(mean, 6), "rate_sd_per_s": round(sd, 6)}
    levels = keepalive_levels(idle, state.policy, boot_s, state.service_s)
    return {
        "desired": d.desired,
        "actual": d.capacity,
        "ready": state.ready,
        "needed": d.needed,
        "reason": d.reason,
        "next_prewarm_at": _iso_s(d.next_prewarm_at),
        "decided_at": iso(now),
        "queued": state.queued,
        "running": state.running,
        "boot_s": round(state.boot_s, 3),
        "service_s": round(state.service_s, 3),
        "may_wait": round(waits_allowed(state.policy, state.ready, boot_s, state.service_s), 3),
        "backlog_workers": d.backlog_workers,
        "holds_s": [round(h, 3) for h in hold_levels_s(d.memory.levels, boot_s, state.policy)],
        "idle_windows": {
            "representative": idle.representative,
            "prewarm_s": None if idle.prewarm_s is None else round(idle.prewarm_s, 3),
            "keepalive_s": round(levels[0], 3),
            "wake_requests": round(idle.wake_requests, 3),
            "keepalive_levels_s": [round(w, 3) for w in levels],
        },
        "forecast": forecast,
        "recent_rate_per_s": None if models.recent_rate is None else round(models.recent_rate, 6),
        "models_fitted_at": _iso_s(models.fitted_at) if models is not NONE else None,
    }


def _iso_s(t: float | None) -> str | None:
    return None if t is None else iso(datetime.fromtimestamp(t, UTC))


def _view(w: Worker) -> fleet.WorkerView:
    return fleet.WorkerView(w.id, WorkerState(w.state), w.deployment_version, w.reason)


def _stop(session: Session, env: Env, worker_id: str, reason: str) -> None:
    w = session.get(Worker, worker_id)
    if w is not None:
        w.reason = reason
    env.provider.stop(worker_id)
    tick_trace.note(
        "worker.stop", **{"platform.worker.id": worker_id, "platform.worker.reason": reason}
    )


def _start(
    session: Session,
    env: Env,
    dep: Deployment,
    reason: str,
    free: warm_pool.FreePool | None,
    est: Estimates,
    now: datetime,
) -> tuple[Worker, Placement]:
    """A worker for `dep`: an idle warm-pool worker when placement says it is ready sooner,
    else a new boot."""
    spec = dep.spec
    model_uri, storage_env = spec.model, {}
    try:
        access = storage_access.resolve(session, env.settings, dep.tenant_id, spec.model)
        model_uri, storage_env = access.uri, access.worker_env(storage_access.platform_env())
    except InvalidRequest as exc:
        # A spec accepted before its tenant lost access (or before the rules existed): the
        # worker gets no credentials, fails to read, and the crash-loop gate says why.
        log.warning(
            "deployment %s: model not readable by its tenant: %s",
            dep.id,
            exc.detail,
            extra={"deployment_id": dep.id},
        )
    assignment = Assignment(
        deployment_id=dep.id,
        deployment_version=dep.version,
        model_uri=model_uri,
        queue=deployment_queue(dep.id),
        max_concurrency=spec.target_concurrency,
        storage_env=dict(storage_env),
    )
    candidates = free.candidates(spec.accelerator, model_uri) if free else []
    placement = place(candidates, est)
    if placement.worker_id is not None and free is not None:
        w = free.take(placement.worker_id)
        if worker_records.assign(session, env.settings, w, dep, reason, now):
            session.commit()  # the worker acts on its assignment only once it is recorded
            if warm_pool.send(env, w, assignment, now):
                _noted_start(w, dep, reason, placement.reason)
                log.info(
                    "assigned pool worker %s to %s [%s] (%s)",
                    w.id,
                    dep.name,
                    placement.reason,
                    reason,
                    extra={"worker_id": w.id, "deployment_id": dep.id, "reason": reason},
                )
                return w, placement
            worker_records.transition(
                session, env.settings, w.id, WorkerState.FAILED, now, now, "assignment_not_sent"
            )
        # gone from the pool meanwhile: a boot, then
        placement = place([], est)
    w = worker_records.create(session, dep, spec.accelerator, reason, now)
    session.flush()
    w.pid = env.provider.start(WorkerSpec(w.id, spec.accelerator, assignment))
    _noted_start(w, dep, reason, placement.reason)
    log.info(
        "started worker %s for %s [%s] (%s)",
        w.id,
        dep.name,
        placement.reason,
        reason,
        extra={"worker_id": w.id, "deployment_id": dep.id, "reason": reason},
    )
    return w, placement


def _noted_start(w: Worker, dep: Deployment, reason: str, placement: str) -> None:
    tick_trace.note(
        "worker.start",
        **{
            "platform.worker.id": w.id,
            tracing.DEPLOYMENT_ID: dep.id,
            "platform.worker.reason": reason,
            "platform.worker.placement": placement,
        },
    )


def _fail_waiting(
    session: Session, env: Env, dep: Deployment, history: BootHistory, now: datetime
) -> None:
    """Workers of this version keep failing: the jobs that wait for one fail now, saying why."""
    error = {
        "type": "deployment_unavailable",
        "message": (
            f"{history.consecutive_failures} workers of deployment '{dep.name}' (version "
            f"{dep.version}) failed in a row (last: {history.last_reason or 'unknown'}); check "
            "its model URI and worker logs, then update the deployment"
        ),
    }
    ending = finish.failed(error, "crash_loop", pending_only=True)
    ids = job_queries.pending_ids(session, dep.id)
    failed = finish.finish(session, env.outbox, [(i, ending) for i in ids], now)
    if failed:
        log.warning(
            "failed %d waiting jobs of %s: crash loop",
            len(failed),
            dep.name,
            extra={"deployment_id": dep.id, "reason": "crash_loop"},
        )

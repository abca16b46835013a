"""The scaling reconciler: per live deployment, drain workers of an old version, ask the pure
`decide()` how many workers to run, start or stop workers, and in a crash loop fail the jobs
that wait (through `services.finish`). Workers of deleted deployments are drained.

`Demand` is this process's memory of when each deployment last had work; it only refines the
scale-down window (the database's last completion time stands in after a restart).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from control_plane.db.models import Deployment, Worker
from control_plane.domain import fleet
from control_plane.domain.autoscaler import DeploymentLoad, decide
from control_plane.domain.crash_loop import may_start
from control_plane.providers.base import WorkerSpec
from control_plane.reconcile.env import Env
from control_plane.services import deployments, events, finish, job_queries, jobs, workers
from worker.protocol import EventType, WorkerState, deployment_queue

log = logging.getLogger(__name__)


@dataclass
class Demand:
    last_at: dict[str, datetime] = field(default_factory=dict)  # deployment id → last demand


def scale_all(session: Session, env: Env, demand: Demand, now: datetime) -> None:
    load = job_queries.load_by_deployment(session)
    for dep in deployments.list_live(session):
        scale(session, env, dep, load.get(dep.id, (0, 0, None)), demand, now)
    session.commit()


def scale(
    session: Session,
    env: Env,
    dep: Deployment,
    load: tuple[int, int, datetime | None],
    demand: Demand,
    now: datetime,
) -> None:
    pending, running, _ = load
    if pending or running:
        demand.last_at[dep.id] = now
    live = workers.live(session, dep.id)
    views = [_view(w) for w in live]
    for w in fleet.to_drain(views, dep.version):
        log.info("draining worker %s of %s: new version", w.id, dep.name)
        _stop(session, env, w.id, fleet.NEW_VERSION)
    active = fleet.capacity(views, dep.version)
    last = demand.last_at.get(dep.id) or job_queries.last_completed_at(session, dep.id)
    spec = dep.spec
    decision = decide(
        spec.scaling_policy(), DeploymentLoad(pending, running, len(active), last), now
    )
    if decision.desired > len(active):
        history = workers.boot_history(session, dep.id, dep.version)
        verdict = may_start(history, now)
        if verdict.give_up:
            _fail_waiting(session, env, dep, history.consecutive_failures, history.last_reason, now)
            return
        if verdict.start:
            for _ in range(decision.desired - len(active)):
                _start(session, env, dep, decision.reason, now)
        session.commit()
        for job_id in jobs.mark_starting(session, dep.id, verdict.reason):
            events.publish(env.redis, job_id, EventType.STARTING, {"reason": verdict.reason})
    for w in fleet.scale_down_victims(active, decision.desired):
        log.info("scaling down worker %s of %s (%s)", w.id, dep.name, decision.reason)
        _stop(session, env, w.id, fleet.SCALE_DOWN)


def stop_deleted(session: Session, env: Env) -> None:
    """Workers whose deployment was deleted drain and exit."""
    live_ids = {d.id for d in deployments.list_live(session)}
    for w in workers.live(session):
        if w.deployment_id not in live_ids and w.state != WorkerState.DRAINING:
            _stop(session, env, w.id, fleet.DEPLOYMENT_DELETED)
    session.commit()


def _view(w: Worker) -> fleet.WorkerView:
    return fleet.WorkerView(w.id, WorkerState(w.state), w.deployment_version, w.reason)


def _stop(session: Session, env: Env, worker_id: str, reason: str) -> None:
    w = session.get(Worker, worker_id)
    if w is not None:
        w.reason = reason
    env.provider.stop(worker_id)


def _start(session: Session, env: Env, dep: Deployment, reason: str, now: datetime) -> None:
    spec = dep.spec
    w = workers.create(session, dep, spec.accelerator, reason, now)
    session.flush()
    w.pid = env.provider.start(
        WorkerSpec(
            worker_id=w.id,
            deployment_id=dep.id,
            deployment_version=dep.version,
            model_uri=spec.model,
            accelerator=spec.accelerator,
            queue=deployment_queue(dep.id),
            max_concurrency=spec.target_concurrency,
        )
    )
    log.info("started worker %s for %s (%s)", w.id, dep.name, reason)


def _fail_waiting(
    session: Session, env: Env, dep: Deployment, failures: int, reason: str | None, now: datetime
) -> None:
    """Workers of this version keep failing: the jobs that wait for one fail now, saying why."""
    error = {
        "type": "deployment_unavailable",
        "message": (
            f"{failures} workers of deployment '{dep.name}' (version {dep.version}) failed "
            f"in a row (last: {reason or 'unknown'}); check its model URI and worker logs, "
            "then update the deployment"
        ),
    }
    ending = finish.failed(error, "crash_loop", pending_only=True)
    ids = job_queries.pending_ids(session, dep.id)
    failed = finish.finish(session, env.outbox, [(i, ending) for i in ids], now)
    if failed:
        log.warning("failed %d waiting jobs of %s: crash loop", len(failed), dep.name)

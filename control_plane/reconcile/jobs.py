"""Reconcilers of job lifecycles, each reading what it needs and applying its plan
(`domain/plans/jobs.py`): requeue the jobs of dead workers and the hand-offs their worker never
received, expire jobs whose ttl passed, time out jobs far past their execution limit, re-send
lost wake-ups, and forget the broker's unacked wake-ups that nothing needs (domain/wakeups.py).

Every job that ends here ends through `services.jobs.finish` (the one path to a terminal state).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import redis
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from common.protocol import (
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_JOBS_FIELD,
    deployment_queue,
    worker_heartbeat_key,
)
from control_plane.db.models import Job, Worker
from control_plane.domain.fleet import Held, unheld
from control_plane.domain.plans.actions import Action
from control_plane.domain.plans.jobs import (
    HANDOFF_LOST,
    WORKER_LOST,
    plan_expiry,
    plan_forget,
    plan_redispatch,
    plan_take_back,
)
from control_plane.domain.states import PENDING
from control_plane.domain.wakeups import JobState
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.services.jobs import job_queries
from control_plane.services.jobs.dispatch import (
    queue_depth,
    unacked_wakeups,
)

log = logging.getLogger(__name__)
# The worker enforces execution limits itself; the control plane steps in after this grace.
EXECUTION_GRACE_S = 30.0
# A live worker claims a delivered wake-up, and acks a finished job's, well within this.
WAKEUP_GRACE_S = 10.0
# A job handed to a worker is popped within milliseconds of its commit; one its worker's beats
# still do not list this long after a beat that followed the commit was never received (five
# heartbeats: a worker whose threads are starved for a few seconds is not robbed of a job).
HANDOFF_GRACE_S = 5 * HEARTBEAT_INTERVAL_S
# A worker's last reports are in flight as it reports its end: its jobs still running this
# long after it stopped or failed (and not requeued by the tick that found it dead) have none
# coming. The same five heartbeats.
ORPHAN_GRACE_S = HANDOFF_GRACE_S
_IN_CHUNK = 500  # ids per IN (...) query


def requeue_orphans(session: Session, env: Env, dead: list[str], now: datetime) -> None:
    """Running jobs of dead workers go back to the queue as a new attempt, or fail once they
    lost MAX_ATTEMPTS workers. The lost attempt ends where its worker's life ended.

    `dead`: the workers this tick found dead. Also, on every tick, any running job of a worker
    that stopped or failed more than ORPHAN_GRACE_S ago: the tick that ended the worker
    commits that before this step's transaction, and a replica that died or was deposed in
    between (a failover) never requeued its jobs; an admission's hand-off can commit after its
    worker was failed (a worker's own claim is refused then: `api/routes/internal.py`); a
    worker that stops with a job still running (its drain's limit) reports nothing more.
    (Only the dead of the tick were requeued: such a job stayed `running` until its execution
    limit, and then timed out.)"""
    lost: dict[str, tuple[str, int, datetime]] = {}
    for job in job_queries.running_on(session, dead):
        w = session.get(Worker, job.worker_id) if job.worker_id else None
        lost[job.id] = (job.id, job.attempt, (w.stopped_at if w is not None else None) or now)
    ended_before = now - timedelta(seconds=ORPHAN_GRACE_S)
    for job_id, attempt, ended_at in job_queries.running_on_ended(session, ended_before):
        lost.setdefault(job_id, (job_id, attempt, ended_at))
    _apply(session, env, plan_take_back(list(lost.values()), WORKER_LOST), now)


def _apply(session: Session, env: Env, actions: Sequence[Action], now: datetime) -> None:
    act = Actuator(session, env, now)
    act.apply(actions)
    act.commit()


def requeue_unheld(
    session: Session, env: Env, missing_since: dict[tuple[str, int], float], now: datetime
) -> None:
    """Running jobs their live worker never received (a job handed to it at admission whose
    push was lost: services/jobs/handoff.py) go back to the queue as a new attempt, or fail once
    they lost MAX_ATTEMPTS. Only workers that list what they hold in their heartbeat are
    judged; a Redis that cannot be read leaves it for the next tick. `missing_since`: the
    reconciler's memory across ticks (`fleet.unheld`), updated here."""
    running: list[tuple[str, int, str]] = [
        (job_id, attempt, str(worker_id))
        for job_id, attempt, worker_id in session.execute(_RUNNING_ON_HANDOFF_WORKERS)
    ]
    worker_ids = sorted({worker_id for _, _, worker_id in running})
    try:
        beats = env.redis.mget([worker_heartbeat_key(w) for w in worker_ids]) if running else []
    except redis.RedisError as exc:
        log.info("held jobs not checked: %s", type(exc).__name__)
        return
    held = {w: h for w, beat in zip(worker_ids, beats, strict=True) if (h := _held(beat))}
    lost, still = unheld(running, held, missing_since, HANDOFF_GRACE_S)
    missing_since.clear()
    missing_since.update(still)
    lost_at = [(job_id, attempt, now) for job_id, attempt in lost]
    _apply(session, env, plan_take_back(lost_at, HANDOFF_LOST), now)


def _held(beat: bytes | str | None) -> Held | None:
    """What a beat says its worker holds; None without a list (a worker that claims only)."""
    if beat is None:
        return None
    try:
        doc = json.loads(beat)
        ids = doc[HEARTBEAT_JOBS_FIELD]
        return Held(float(doc["at"]), frozenset(str(i) for i in ids))
    except (ValueError, KeyError, TypeError):
        return None


# The running jobs of the workers that take hand-offs (the others claim every job they hold).
# `status = 'running'` as a literal: the partial index of running jobs serves it.
_RUNNING_ON_HANDOFF_WORKERS = (
    select(Job.id, Job.attempt, Job.worker_id)
    .join(Worker, Worker.id == Job.worker_id)
    .where(text("jobs.status = 'running'"), Worker.takes_handoffs.is_(True))
)


def end_overdue(session: Session, env: Env, now: datetime) -> None:
    """Pending jobs whose ttl passed before a worker claimed them become `expired`; running
    jobs far past their limit (the worker missed it) become `timed_out`."""
    overdue = job_queries.overdue_ids(session, now)
    overrun = job_queries.overrunning(session, EXECUTION_GRACE_S, now)
    _apply(session, env, plan_expiry(overdue, overrun), now)


def redispatch(session: Session, env: Env, now: datetime) -> None:
    """Re-send wake-ups only where jobs wait but their queue is empty (a lost message)."""
    waiting = [
        (job_id, dep_id, kind)
        for job_id, dep_id, kind in session.execute(
            select(Job.id, Job.deployment_id, Job.kind).where(
                Job.status.in_([s.value for s in PENDING]),
                # Batch jobs without a slot must stay asleep: the batch pump dispatches them.
                Job.dispatched_at.is_not(None),
            )
        )
    ]
    deployments = {dep_id for _, dep_id, _ in waiting}
    empty = {d: queue_depth(env.celery, deployment_queue(d)) == 0 for d in deployments}
    _apply(session, env, plan_redispatch(waiting, empty), now)


def forget_stale_wakeups(session: Session, env: Env, now: datetime) -> int:
    """Forget the unacked wake-ups nothing needs (a dead worker's, the ack a broker restart
    lost); returns how many. A broker that cannot be reached is left for the next tick."""
    cutoff = now.timestamp()
    try:
        entries = unacked_wakeups(env.redis, cutoff - WAKEUP_GRACE_S)
        if not entries:
            return 0
        ids = sorted({e.job_id for e in entries if e.job_id is not None})
        states: dict[str, JobState] = {}
        for i in range(0, len(ids), _IN_CHUNK):
            rows = session.execute(
                select(Job.id, Job.status, Job.completed_at).where(
                    Job.id.in_(ids[i : i + _IN_CHUNK])
                )
            ).all()
            for job_id, status, completed_at in rows:
                done = completed_at.timestamp() if completed_at is not None else None
                states[job_id] = JobState(status, done)
        actions = plan_forget(entries, states, cutoff, WAKEUP_GRACE_S)
        _apply(session, env, actions, now)
        return sum(len(x.tags) for x in actions)
    except redis.RedisError as exc:
        log.info("unacked wake-ups not checked: %s", type(exc).__name__)
        return 0

"""The reconciler's driver: one tick runs each reconciler in order, each with its own
transaction, so one concern's failure or slowness is visible on its own. Each reads what it
needs, asks its pure plan in `domain/plans/` (or `domain.scaling.decide`) what to do, and hands
the actions to the one actuator (`actuator.py`), which alone starts, stops and kills workers
and writes what a plan decided (the Kubernetes controller pattern).

    workers.reap, workers.check_liveness   → ids of workers that died this tick
    workers.settle_idle                    busy workers whose jobs all ended become idle
    jobs.requeue_orphans                   their running jobs: a new attempt, or failed
    jobs.requeue_unheld                    running jobs a live worker never received (a lost
                                           hand-off): the same
    jobs.end_overdue                       pending past their ttl expire; running far past
                                           their limit time out
    scale.scale_all, scale.stop_deleted    decide() per deployment; start / drain workers
                                           (models from the refresher thread, refresh.py),
                                           taking idle warm-pool workers first when faster
    pool.keep                              boot / stop warm-pool workers toward the target
    batches.pump                           bounded fan-out and completion of batches
    billing                                roll open segments, allocate busy cost to jobs
    jobs.redispatch                        every REDISPATCH_EVERY_S, and at once when Redis
                                           came back: re-send lost wake-ups
    jobs.forget_stale_wakeups              every WAKEUP_SWEEP_EVERY: drop unacked wake-ups
                                           nothing needs (kombu would redeliver them in 1 h)
    webhooks.resend_lost                   every WEBHOOK_SWEEP_EVERY: completed webhooks whose
                                           Celery message was lost get their next attempt
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import redis
from sqlalchemy.orm import Session, sessionmaker

from common import heap
from common.protocol import WorkerState
from control_plane.domain.clock import Clock
from control_plane.providers.base import Exited
from control_plane.reconcile import (
    batches,
    billing,
    fence,
    jobs,
    pool,
    refresh,
    scale,
    tick_trace,
    webhooks,
    workers,
)
from control_plane.reconcile.env import Env
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)
# Pending jobs get a fresh wake-up this often (lost broker messages, broker restarts).
REDISPATCH_EVERY = timedelta(seconds=30)
WAKEUP_SWEEP_EVERY = timedelta(seconds=5)
WEBHOOK_SWEEP_EVERY = timedelta(seconds=10)


# A tick at 1,000 deployments allocates ~10,000 ORM objects: with the default threshold (700)
# the cyclic collector ran many times per tick, each young collection promoting them further.
GC_THRESHOLD = (10_000, 10, 10)


def tune_gc() -> None:
    """For the reconciler process, once its imports are done: what exists now (modules,
    settings, mappers) is never collected, so collections only walk what ticks allocate."""
    heap.settle(threshold=GC_THRESHOLD)


class Reconciler:
    """Runs the reconcilers; holds only what must survive between ticks in this process, and
    the autoscaler's model refresher (a thread once `start`ed; tests call `refresher.refresh`)."""

    def __init__(self, env: Env, sessions: sessionmaker[Session]) -> None:
        self.env = env
        self.sessions = sessions
        self.demand = scale.Demand()
        # jobs.requeue_unheld's memory across ticks: (job, attempt) → first beat that missed it
        self.unheld: dict[tuple[str, int], float] = {}
        self.refresher = refresh.ModelRefresher(env, sessions)
        self.last_redispatch: datetime | None = None
        # Redis failed this process's last round trip (a restart, an outage); when it answers
        # again, the jobs accepted meanwhile (their wake-ups lost) are woken at once
        self.redis_down = False
        self.redispatch_now = False
        self.last_wakeup_sweep: datetime | None = None
        self.last_webhook_sweep: datetime | None = None

    def start(self, clock: Clock) -> None:
        """Start the background refits (the reconciler process; `shutdown` stops them)."""
        self.refresher.start(clock)

    def tick(self, now: datetime, token: int | None = None) -> None:
        """One pass of every reconciler. `token`: this replica's fencing token (the reconciler
        process always has one; tests that drive one reconciler may leave it out): each
        transaction of the tick checks it first and raises `fence.Deposed` once it is stale."""
        trace = tick_trace.begin()  # None unless tracing is on
        try:
            self._tick(now, token, trace)
        except BaseException as exc:
            tick_trace.end(trace, token, exc)
            raise
        tick_trace.end(trace, token)

    def _tick(self, now: datetime, token: int | None, trace: tick_trace.TickTrace | None) -> None:
        env = self.env
        self._watch_redis()
        with self.sessions() as session:
            if token is not None:
                fence.fence(session, token)
            with tick_trace.step(trace, "workers"):
                dead = workers.reap(session, env, now) + workers.check_liveness(session, env, now)
                workers.settle_idle(session, env, now)
            with tick_trace.step(trace, "jobs"):
                jobs.requeue_orphans(session, env, dead, now)
                jobs.requeue_unheld(session, env, self.unheld, now)
                jobs.end_overdue(session, env, now)
            with tick_trace.step(trace, "scale"):
                scale.scale_all(session, env, self.demand, self.refresher.latest, now)
                scale.stop_deleted(session, env, now)
            with tick_trace.step(trace, "pool"):
                pool.keep(session, env, self.refresher.latest, now)
            with tick_trace.step(trace, "batches"):
                batches.pump(session, env, now)
            with tick_trace.step(trace, "billing"):
                billing.roll_open_segments(session, env, now)
                billing.allocate_ready(session, now)
                session.commit()
            with tick_trace.step(trace, "sweeps"):
                self._sweep(session, now)

    def _sweep(self, session: Session, now: datetime) -> None:
        """The periodic sweeps, each when due."""
        env = self.env
        last = self.last_redispatch
        if self.redispatch_now or (last is not None and now - last > REDISPATCH_EVERY):
            self.last_redispatch = now
            jobs.redispatch(session, env, now)
            self.redispatch_now = False  # (done: a redispatch that failed is tried again)
        elif last is None:
            self.last_redispatch = now
        if self.last_wakeup_sweep is None or now - self.last_wakeup_sweep > WAKEUP_SWEEP_EVERY:
            self.last_wakeup_sweep = now
            jobs.forget_stale_wakeups(session, env, now)
        if self.last_webhook_sweep is None or now - self.last_webhook_sweep > WEBHOOK_SWEEP_EVERY:
            self.last_webhook_sweep = now
            webhooks.resend_lost(session, env, now)

    def _watch_redis(self) -> None:
        """One round trip to Redis, first in every tick (a tick that meets a dead Redis fails
        later on, before its sweeps). A failure, then an answer: Redis is back, and the jobs
        admitted while it was down, whose wake-ups were lost, are woken at this tick's
        redispatch instead of waiting up to REDISPATCH_EVERY for the sweep."""
        try:
            self.env.redis.ping()
        except redis.RedisError:
            self.redis_down = True
            return
        if self.redis_down:
            log.info("Redis is back: waking the jobs that wait", extra={"reason": "redis_back"})
            self.redis_down = False
            self.redispatch_now = True

    def stop(self) -> list[Exited]:
        """Stop the refits and the workers only this process reaches (they drain); those that
        ended, for `record_stopped` when this replica still leads."""
        self.refresher.stop()
        return self.env.provider.shutdown(timeout_s=10.0)

    def record_stopped(self, exited: list[Exited], now: datetime, token: int | None) -> None:
        """Record the workers `stop` ended as stopped (`token`: as in `tick`)."""
        with self.sessions() as session:
            if token is not None:
                fence.fence(session, token)
            for e in exited:
                worker_records.transition(
                    session,
                    self.env.settings,
                    e.worker_id,
                    WorkerState.STOPPED,
                    now,
                    now,
                    reason="platform_shutdown",
                )
            session.commit()

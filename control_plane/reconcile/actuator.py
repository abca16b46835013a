"""The reconciler's one actuator: it applies the actions the plans return (`domain/plans/`), and
is the only code of the tick that starts, stops or kills workers (`worker_actions.py`) or writes
what a plan decided. What must follow a commit (wake-ups, events, logs of what happened) waits
for `commit`.

A plan never acts; this never decides: every branch here is about how to carry an action out
(a pool worker taken meanwhile is replaced by a boot; a job that moved on is left alone).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from common import tracing
from common.protocol import EventType, webhook_resent_key
from control_plane.db.models import Job, Worker
from control_plane.domain import endings
from control_plane.domain.clock import iso
from control_plane.domain.plans import actions as a
from control_plane.domain.plans.jobs import WORKER_LOST
from control_plane.domain.states import JobStatus
from control_plane.metrics import families, on_commit
from control_plane.reconcile import tick_trace, worker_actions
from control_plane.reconcile.env import Env
from control_plane.services.jobs import (
    batch_slots,
    batches,
    claims,
    events,
    finish,
    job_queries,
    job_store,
)
from control_plane.services.jobs.dispatch import dispatch_job, forget_unacked, wake
from control_plane.services.workers.billing import close_segment
from control_plane.tasks_api import enqueue_batch_webhook, enqueue_webhook

log = logging.getLogger(__name__)
# One resend per subject this often at most: while no Celery worker runs, every sweep would
# find the same chains lost again, and the queue would grow by all of them each time.
RESEND_EVERY_S = 300


class Actuator:
    """Applies one step's actions in `session`; `commit` then runs what waits for it."""

    def __init__(self, session: Session, env: Env, now: datetime) -> None:
        self.session = session
        self.env = env
        self.now = now
        self._after_commit: list[Callable[[], None]] = []
        # deployment id → the workers started for it in this step (its cold-start report)
        self.started: dict[str, list[Worker]] = {}
        # deployment id → the last placement of a worker for it (shown with its decision)
        self.placements: dict[str, dict[str, Any]] = {}
        self.resent = 0  # lost webhooks sent again in this step

    def apply(self, actions: Iterable[a.Action]) -> None:
        for action in actions:
            self._apply(action)

    def commit(self) -> None:
        self.session.commit()
        todo, self._after_commit = self._after_commit, []
        for fn in todo:
            fn()

    def _apply(self, action: a.Action) -> None:
        s, env, now = self.session, self.env, self.now
        match action:
            case a.RecordExit():
                worker_actions.record_exit(s, env, action, now)
            case a.NoteHeartbeat():
                w = s.get(Worker, action.worker_id)
                if w is not None:
                    w.last_heartbeat_at = action.at
            case a.LoseWorker():
                worker_actions.lose(s, env, action, now)
            case a.StopWorker():
                worker_actions.stop(s, env, action)
            case a.StartWorker():
                self._start(action)
            case a.BootPoolWorker():
                worker_actions.boot_pool_worker(s, env, action, now)
            case a.HoldWaiting():
                self._hold(action)
            case a.FailWaiting():
                self._fail_waiting(action)
            case a.TakeBack():
                self._take_back(action)
            case a.EndJobs():
                for job_id, attempt, ended_at in action.lost:
                    claims.end_attempt(s, job_id, attempt, WORKER_LOST, ended_at)
                finish.finish(s, env.outbox, list(action.endings), now)
            case a.Redispatch():
                log.info(
                    "re-sending the wake-up of job %s",
                    action.job_id,
                    extra={"job_id": action.job_id, "deployment_id": action.deployment_id},
                )
                dispatch_job(env.redis, action.deployment_id, action.job_id, action.kind)
            case a.ForgetWakeups():
                forget_unacked(env.redis, list(action.tags))
                log.info("forgot %d unacked wake-ups nothing needs", len(action.tags))
            case a.DispatchLines():
                self._dispatch_lines(action)
            case a.CompleteBatch():
                batches.complete(s, env.celery, env.settings, action.batch_id, now)
            case a.RollSegment():
                w = s.get(Worker, action.worker_id)
                if w is not None:
                    close_segment(
                        s, env.settings, w, action.phase, action.start, action.end, "rolled"
                    )
                    w.state_since = action.end
            case a.ResendWebhook():
                self._resend(action)

    def _start(self, x: a.StartWorker) -> None:
        new, placement = worker_actions.start(self.session, self.env, x, self.now)
        count = functools.partial(families.cold_start, new.accelerator, placement.choice)
        on_commit.after_commit(self.session, count)  # by tier: pool_host_tier, pool or boot
        self.started.setdefault(x.deployment_id, []).append(new)
        self.placements[x.deployment_id] = {
            "choice": placement.choice,
            "worker_id": new.id,
            "eta_s": placement.eta_s,
            "options": {o.choice: o.eta_s for o in placement.options},
            "at": iso(self.now),
        }

    def _hold(self, x: a.HoldWaiting) -> None:
        waiting = [w.id for w in job_store.mark_starting(self.session, x.deployment_id, x.reason)]
        if x.announce and waiting:
            self._after_commit.append(
                functools.partial(
                    events.publish_many,
                    self.env.redis,
                    waiting,
                    EventType.STARTING,
                    {"reason": x.reason},
                )
            )

    def _fail_waiting(self, x: a.FailWaiting) -> None:
        ending = endings.failed(x.error, "crash_loop", pending_only=True)
        ids = job_queries.pending_ids(self.session, x.deployment_id)
        failed = finish.finish(self.session, self.env.outbox, [(i, ending) for i in ids], self.now)
        if failed:
            log.warning(
                "failed %d waiting jobs of %s: crash loop",
                len(failed),
                x.deployment_name,
                extra={"deployment_id": x.deployment_id, "reason": "crash_loop"},
            )

    def _take_back(self, x: a.TakeBack) -> None:
        """The lost attempt ends unbilled; its number stays the fence, so a late report of it
        can no longer apply. A job that moved on meanwhile (its report arrived) is left."""
        claims.end_attempt(self.session, x.job_id, x.attempt, WORKER_LOST, x.ended_at)
        taken = self.session.execute(
            update(Job)
            .where(Job.id == x.job_id, Job.attempt == x.attempt, Job.status == JobStatus.RUNNING)
            .values(status=JobStatus.QUEUED, status_reason=x.reason, worker_id=None)
            .returning(Job.deployment_id, Job.kind, Job.traceparent)
        ).first()
        if taken is not None:
            dep_id, kind, traceparent = taken
            self._after_commit.append(
                functools.partial(self._requeued, x, dep_id, kind, traceparent)
            )

    def _requeued(self, x: a.TakeBack, dep_id: str, kind: str, traceparent: str | None) -> None:
        ids = {"job_id": x.job_id, "deployment_id": dep_id, "attempt": x.attempt}
        log.warning(
            "job %s lost its worker (%s); requeued (attempt %d)",
            x.job_id,
            x.reason,
            x.attempt,
            extra={**ids, "reason": x.reason},
        )
        wake(self.env.redis, dep_id, x.job_id, kind, {"reason": x.reason})
        span_ids = {tracing.JOB_ID: x.job_id, tracing.JOB_ATTEMPT: x.attempt}
        tick_trace.note("job.requeue", **span_ids)
        reason = {"platform.job.reason": x.reason}
        tick_trace.requeued(traceparent, x.ended_at, self.now, **span_ids, **reason)

    def _resend(self, x: a.ResendWebhook) -> None:
        """Enqueue the attempt, unless a sweep sent it again lately (RedisError: the broker is
        likely down too; the caller stops its sweep)."""
        if not self.env.redis.set(
            webhook_resent_key(x.subject_id), x.attempt, nx=True, ex=RESEND_EVERY_S
        ):
            return
        enqueue = enqueue_webhook if x.event.startswith("job.") else enqueue_batch_webhook
        enqueue(self.env.celery, x.subject_id, x.event, x.msg_id, x.attempt)
        self.resent += 1
        ids = {"job_id": x.subject_id} if x.event.startswith("job.") else {"batch_id": x.subject_id}
        log.warning(
            "%s of %s: its delivery was lost; attempt %d sent again",
            x.event,
            x.subject_id,
            x.attempt,
            extra={**ids, "attempt": x.attempt},
        )

    def _dispatch_lines(self, x: a.DispatchLines) -> None:
        next_ids = batch_slots.dispatch_next(self.session, x.batch_id, x.count, self.now)
        # NOTE: committed before the wake-ups: a lost wake-up is re-sent by the reconciler,
        # while a wake-up for an uncommitted slot could exceed max_in_flight.
        self._after_commit.append(
            functools.partial(
                batch_slots.wake_dispatched, self.env.redis, x.deployment_id, next_ids, self.now
            )
        )
        if next_ids:
            log.info("batch %s: dispatched %d more jobs", x.batch_id, len(next_ids))

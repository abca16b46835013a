"""Control loops of the embedded platform: autoscaler (+ provider) and a small reconciler.

`python -m control_plane.loops` runs them in one process that owns the local worker processes.
Each tick reads state from SQL, asks the pure `decide()` what to do, and applies it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.db.models import Deployment, Job, Worker
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.autoscaler import DeploymentLoad, ScalingPolicy, decide
from control_plane.domain.crash_loop import BootHistory, may_start
from control_plane.domain.states import PENDING
from control_plane.providers.base import Provider, WorkerSpec
from control_plane.providers.local import LocalProvider, worker_env
from control_plane.services import batches, billing, deployments, events, jobs, workers
from control_plane.services.dispatch import dispatch_job, make_celery, queue_depth, wake
from control_plane.settings import Settings
from control_plane.tasks_api import enqueue_webhook
from worker.protocol import (
    HEARTBEAT_TTL_S,
    EventType,
    WorkerState,
    deployment_queue,
    job_cancel_key,
    worker_heartbeat_key,
)

log = logging.getLogger(__name__)
# Pending jobs get a fresh wake-up this often (lost broker messages, broker restarts).
REDISPATCH_EVERY_S = 30.0
# A worker without a heartbeat for HEARTBEAT_TTL_S is lost, once it had time to send one.
HEARTBEAT_GRACE_S = 2 * HEARTBEAT_TTL_S
# The worker enforces execution limits itself; the control plane steps in after this grace.
EXECUTION_GRACE_S = 30.0


def policy_of(spec: dict[str, Any]) -> ScalingPolicy:
    return ScalingPolicy(
        min_workers=int(spec.get("min_workers", 0)),
        max_workers=int(spec.get("max_workers", 1)),
        target_concurrency=int(spec.get("target_concurrency", 1)),
        scaledown_window_s=float(spec.get("scaledown_window_s", 60)),
    )


class AutoscalerLoop:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        r: redis.Redis,
        celery: Celery,
        provider: Provider,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.redis = r
        self.celery = celery
        self.provider = provider
        # deployment id → last time it had queued or running work (seen by this process).
        self.last_demand: dict[str, datetime] = {}
        self.last_redispatch = time.monotonic()

    def tick(self, now: datetime) -> None:
        with self.sessions() as session:
            dead = self._reap(session, now) + self._check_liveness(session, now)
            self._requeue_orphans(session, dead, now)
            self._enforce_job_limits(session, now)
            load = jobs.load_by_deployment(session)
            for dep in deployments.list_live(session):
                self._scale(session, dep, load.get(dep.id, (0, 0, None)), now)
            self._stop_deleted(session)
            session.commit()
            # Bounded fan-out of batches (it commits itself).
            batches.pump(session, self.celery, self.redis, now, settings=self.settings)
            self._billing(session, now)
            if time.monotonic() - self.last_redispatch > REDISPATCH_EVERY_S:
                self.last_redispatch = time.monotonic()
                self._redispatch(session)

    def _scale(
        self,
        session: Session,
        dep: Deployment,
        load: tuple[int, int, datetime | None],
        now: datetime,
    ) -> None:
        pending, running, _ = load
        if pending or running:
            self.last_demand[dep.id] = now
        live = workers.live(session, dep.id)
        # A new spec version replaces old workers: they drain (finishing the jobs they hold)
        # while workers of the current version take new work.
        for w in live:
            outdated = w.deployment_version != dep.version
            if outdated and w.state != WorkerState.DRAINING and w.reason != "new_version":
                log.info("draining worker %s of %s: new version", w.id, dep.name)
                w.reason = "new_version"
                self.provider.stop(w.id)
        active = [
            w
            for w in live
            if w.state != WorkerState.DRAINING
            and w.deployment_version == dep.version
            and w.reason != "scale_down_window"
        ]
        last = self.last_demand.get(dep.id) or jobs.last_completed_at(session, dep.id)
        decision = decide(
            policy_of(dep.spec), DeploymentLoad(pending, running, len(active), last), now
        )
        if decision.desired > len(active):
            failures, failed_at, failed_reason = workers.boot_history(session, dep.id, dep.version)
            verdict = may_start(BootHistory(failures, failed_at, failed_reason), now)
            if verdict.give_up:
                self._fail_waiting(session, dep, failures, failed_reason, now)
                return
            if verdict.start:
                for _ in range(decision.desired - len(active)):
                    self._start(session, dep, decision.reason, now)
            session.commit()
            for job_id in jobs.mark_starting(session, dep.id, verdict.reason):
                events.publish(self.redis, job_id, EventType.STARTING, {"reason": verdict.reason})
        elif decision.desired < len(active):
            # Idle workers go first; a busy one drains (finishes its jobs) before exiting.
            order = {
                WorkerState.IDLE: 0,
                WorkerState.BOOTING: 1,
                WorkerState.LOADING: 1,
                WorkerState.WARMING: 1,
                WorkerState.BUSY: 2,
            }
            victims = sorted(active, key=lambda w: order.get(WorkerState(w.state), 3))
            for w in victims[: len(active) - decision.desired]:
                log.info("scaling down worker %s of %s (%s)", w.id, dep.name, decision.reason)
                w.reason = "scale_down_window"
                self.provider.stop(w.id)

    def _start(self, session: Session, dep: Deployment, reason: str, now: datetime) -> Worker:
        accelerator = str(dep.spec.get("accelerator", "cpu"))
        w = workers.create(session, dep, accelerator, reason, now)
        session.flush()
        w.pid = self.provider.start(
            WorkerSpec(
                worker_id=w.id,
                deployment_id=dep.id,
                deployment_version=dep.version,
                model_uri=str(dep.spec["model"]),
                accelerator=accelerator,
                queue=deployment_queue(dep.id),
                max_concurrency=int(dep.spec.get("target_concurrency", 1)),
            )
        )
        log.info("started worker %s for %s (%s)", w.id, dep.name, reason)
        return w

    def _fail_waiting(
        self, session: Session, dep: Deployment, failures: int, reason: str | None, now: datetime
    ) -> None:
        error = {
            "type": "deployment_unavailable",
            "message": (
                f"{failures} workers of deployment '{dep.name}' (version {dep.version}) failed "
                f"in a row (last: {reason or 'unknown'}); check its model URI and worker logs, "
                "then update the deployment"
            ),
        }
        failed = jobs.fail_pending(session, dep.id, error, now)
        session.commit()
        for job in failed:
            events.publish(self.redis, job.id, EventType.FAILED, jobs.to_public(job))
            if job.webhook_url and "completed" in (job.webhook_events or []):
                enqueue_webhook(self.celery, job.id, "job.completed", f"msg_{job.id}_completed_0")
        if failed:
            log.warning("failed %d waiting jobs of %s: crash loop", len(failed), dep.name)

    def _requeue_orphans(self, session: Session, dead: list[str], now: datetime) -> None:
        requeued = jobs.requeue_orphans(session, dead, now)
        session.commit()
        for job in requeued:
            log.warning("job %s lost its worker; requeued (attempt %d)", job.id, job.attempt)
            wake(
                self.redis,
                self.celery,
                job.deployment_id,
                job.id,
                job.kind,
                {"reason": "worker_lost"},
            )

    def _reap(self, session: Session, now: datetime) -> list[str]:
        dead = []
        for exited in self.provider.reap():
            dead.append(exited.worker_id)
            w = session.get(Worker, exited.worker_id)
            if w is None:
                continue
            if exited.returncode == 0:
                workers.transition(session, self.settings, w.id, WorkerState.STOPPED, now, now)
            else:
                log.warning("worker %s exited with %d", w.id, exited.returncode)
                workers.transition(
                    session,
                    self.settings,
                    w.id,
                    WorkerState.FAILED,
                    now,
                    now,
                    reason=f"exit_{exited.returncode}",
                )
        return dead

    def _check_liveness(self, session: Session, now: datetime) -> list[str]:
        """Record heartbeats; workers that stopped heartbeating, or overran max_boot_s, are
        failed and killed. A lost worker's open segment ends at its last heartbeat: time
        after its last sign of life is not billed."""
        live = workers.live(session)
        beats = self.redis.mget([worker_heartbeat_key(w.id) for w in live]) if live else []
        lost = []
        for w, beat in zip(live, beats, strict=True):
            if beat is not None:
                try:
                    seen = datetime.fromtimestamp(float(json.loads(beat)["at"]), UTC)
                    w.last_heartbeat_at = min(max(seen, w.last_heartbeat_at or seen), now)
                except (ValueError, KeyError, TypeError):
                    w.last_heartbeat_at = now
            age_s = (now - w.started_at).total_seconds()
            booting = w.state in (WorkerState.BOOTING, WorkerState.LOADING, WorkerState.WARMING)
            dep = session.get(Deployment, w.deployment_id)
            max_boot_s = float((dep.spec if dep else {}).get("max_boot_s", 600))
            reason, at = None, now
            if booting and age_s > max_boot_s:
                reason = "boot_timeout"
            elif beat is None and age_s > HEARTBEAT_GRACE_S:
                reason = "heartbeat_lost"
                at = max(w.last_heartbeat_at or w.state_since, w.state_since)
            if reason is None:
                continue
            log.warning("worker %s failed: %s", w.id, reason)
            self.provider.kill(w.id)
            workers.transition(
                session,
                self.settings,
                w.id,
                WorkerState.FAILED,
                at,
                now,
                reason=reason,
                note="heartbeat" if reason == "heartbeat_lost" else None,
            )
            lost.append(w.id)
        session.commit()
        return lost

    def _billing(self, session: Session, now: datetime) -> None:
        billing.roll_open_segments(session, self.settings, now)
        billing.allocate_ready(session, now)
        session.commit()

    def _enforce_job_limits(self, session: Session, now: datetime) -> None:
        """Expire pending jobs past their ttl; end running ones far past their limit."""
        limits = {
            d.id: float(d.spec.get("execution_timeout_s", 600))
            for d in deployments.list_live(session)
        }
        expired = jobs.expire_overdue(session, now)
        overrun = jobs.time_out_overrun(session, limits, EXECUTION_GRACE_S, now)
        session.commit()
        for job in expired + overrun:
            public = jobs.to_public(job)
            if job in overrun:
                self.redis.set(job_cancel_key(job.id), "1", ex=24 * 3600)
            events.publish(self.redis, job.id, EventType.FAILED, public)
            if job.webhook_url and "completed" in (job.webhook_events or []):
                enqueue_webhook(self.celery, job.id, "job.completed", f"msg_{job.id}_completed_0")

    def _stop_deleted(self, session: Session) -> None:
        live_ids = {d.id for d in deployments.list_live(session)}
        for w in workers.live(session):
            if w.deployment_id not in live_ids and w.state != WorkerState.DRAINING:
                w.reason = "deployment_deleted"
                self.provider.stop(w.id)

    def _redispatch(self, session: Session) -> None:
        """Re-send wake-ups only where jobs wait but their queue is empty (a lost message)."""
        rows = session.execute(
            select(Job.id, Job.deployment_id, Job.kind).where(
                Job.status.in_([s.value for s in PENDING]),
                # Batch jobs without a slot must stay asleep: pump dispatches them.
                Job.dispatched_at.is_not(None),
            )
        ).all()
        empty: dict[str, bool] = {}
        for job_id, dep_id, kind in rows:
            if dep_id not in empty:
                empty[dep_id] = queue_depth(self.celery, deployment_queue(dep_id)) == 0
            if empty[dep_id]:
                log.info("re-sending the wake-up of job %s", job_id)
                dispatch_job(self.celery, dep_id, job_id, kind)

    def shutdown(self) -> None:
        now = datetime.now(UTC)
        exited = self.provider.shutdown(timeout_s=10.0)
        with self.sessions() as session:
            for e in exited:
                workers.transition(
                    session,
                    self.settings,
                    e.worker_id,
                    WorkerState.STOPPED,
                    now,
                    now,
                    reason="platform_shutdown",
                )
            session.commit()


def main() -> None:
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s loops %(name)s: %(message)s"
    )
    sessions = make_sessionmaker(make_engine(settings.database_url))
    env = worker_env(
        os.environ,
        {
            "PLATFORM_INTERNAL_URL": settings.internal_url,
            "PLATFORM_WORKER_TOKEN": settings.worker_token.get_secret_value(),
            "PLATFORM_REDIS_URL": settings.redis_url,
            "PLATFORM_WORKER_THREADS": str(settings.worker_threads),
        },
    )
    if settings.s3_endpoint_url:
        env["AWS_ENDPOINT_URL"] = settings.s3_endpoint_url
    env.setdefault("AWS_DEFAULT_REGION", settings.s3_region)
    provider = LocalProvider(env, settings.state_dir / "logs" / "workers", settings.worker_python)
    loop = AutoscalerLoop(
        settings,
        sessions,
        redis.Redis.from_url(settings.redis_url),
        make_celery(settings),
        provider,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("autoscaler loop running every %.2fs", settings.autoscaler_interval_s)
    while not stop.is_set():
        try:
            loop.tick(datetime.now(UTC))
        except Exception:
            log.exception("autoscaler tick failed")
        stop.wait(settings.autoscaler_interval_s)
    loop.shutdown()
    log.info("autoscaler loop stopped")


if __name__ == "__main__":
    main()

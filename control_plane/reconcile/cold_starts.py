"""Cold-start progress, each tick, for a deployment whose jobs wait on a booting worker.

Reads the booting workers' heartbeats (weight bytes landed), asks the pure
`domain.cold_start.soonest` for the phase and ETA of the worker expected ready first, and then:
- the waiting jobs' rows follow the phase (`starting`, status_reason no_capacity →
  loading_weights → warming; `jobs.mark_starting`);
- their event streams get a `starting` event `{reason, phase, bytes_done, bytes_total, eta_s}`
  when the phase changes or the progress moved enough (`worth_publishing`), in one round trip;
- the deployment's key holds the latest for `GET /v1/jobs/{id}` (`services/cold_starts.py`);
- jobs whose webhook asked for `starting` get a `job.starting` per new phase.

Redis being down costs only the progress (the tick goes on): jobs keep their last phase.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import redis
from sqlalchemy.orm import Session

from control_plane.db.models import Deployment, Worker
from control_plane.domain.cold_start import (
    BootingWorker,
    ColdStart,
    PhaseTimes,
    soonest,
    worth_publishing,
)
from control_plane.reconcile.env import Env
from control_plane.services import cold_starts, jobs, webhooks
from control_plane.services.webhook_delivery import STARTING_EVENT
from control_plane.tasks_api import enqueue_webhook
from worker.protocol import HEARTBEAT_PROGRESS_FIELD, worker_heartbeat_key

log = logging.getLogger(__name__)


def report(
    session: Session,
    env: Env,
    dep: Deployment,
    booting: list[Worker],
    ready: int,
    times: PhaseTimes,
    last: dict[str, ColdStart],
    now: datetime,
) -> None:
    """Tell the jobs of `dep` how its cold start goes; `last` (per deployment, kept by the
    caller between ticks) is what they were last told."""
    if ready or not booting:
        if last.pop(dep.id, None) is not None:
            cold_starts.forget(env.redis, dep.id)
        return
    views = [
        _view(w, beat, now) for w, beat in zip(booting, _beats(env.redis, booting), strict=True)
    ]
    start = soonest(views, times)
    assert start is not None
    waiting = jobs.mark_starting(session, dep.id, start.reason)
    session.commit()
    # Every tick refreshes the key (GET shows a fresh ETA); events go out on real changes.
    previous = last.get(dep.id)
    tell = worth_publishing(previous, start)
    try:
        cold_starts.publish(env.redis, dep.id, start, [w.id for w in waiting] if tell else [])
    except redis.RedisError as exc:
        log.warning("cold start of %s: progress not published (Redis: %s)", dep.id, exc)
        return
    if tell:
        last[dep.id] = start
    if previous is None or previous.phase != start.phase:
        _webhooks(env, [w for w in waiting if w.wants_starting], start.phase)


def _webhooks(env: Env, waiting: list[jobs.Waiting], phase: str) -> None:
    """`job.starting` for each new phase, to the jobs that asked for it (best effort)."""
    for w in waiting:
        try:
            msg_id = webhooks.message_id(w.id, "starting", w.attempt, phase)
            enqueue_webhook(env.celery, w.id, STARTING_EVENT, msg_id)
        except Exception:
            log.exception("could not enqueue the starting webhook of job %s", w.id)


def _beats(r: redis.Redis, booting: list[Worker]) -> list[Any]:
    try:
        return list(r.mget([worker_heartbeat_key(w.id) for w in booting]))
    except redis.RedisError:
        return [None] * len(booting)


def _view(w: Worker, beat: Any, now: datetime) -> BootingWorker:
    done = total = None
    if beat is not None:
        try:
            progress = json.loads(beat).get(HEARTBEAT_PROGRESS_FIELD) or {}
            done, total = int(progress["bytes_done"]), int(progress["bytes_total"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # no progress yet (or a beat of another shape): phase times only
    return BootingWorker(
        state=w.state,
        in_state_s=max((now - w.state_since).total_seconds(), 0.0),
        bytes_done=done,
        bytes_total=total,
        assigned=w.assigned_at is not None,
    )

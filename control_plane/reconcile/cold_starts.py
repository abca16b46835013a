"""Cold-start progress, each tick, for a deployment whose jobs wait on a booting worker.

Reads the booting workers' heartbeats (weight bytes landed), asks the pure
`domain.cold_start.soonest` for the phase and ETA of the worker expected ready first, and then:
- the waiting jobs' rows follow the phase (`starting`, status_reason no_capacity →
  loading_weights → warming; `jobs.mark_starting`);
- their event streams get a `starting` event `{reason, phase, bytes_done, bytes_total, eta_s}`
  when the phase changes or the progress moved enough (`worth_publishing`), in one round trip;
- the deployment's key holds the latest for `GET /v1/jobs/{id}` (`services/jobs/cold_starts.py`);
- jobs whose webhook asked for `starting` get a `job.starting` per new phase.

Redis being down costs only the progress (the tick goes on): jobs keep their last phase.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from sqlalchemy.orm import Session

from common.protocol import HEARTBEAT_PROGRESS_FIELD, worker_heartbeat_key
from control_plane.db.models import Worker
from control_plane.domain.cold_start import (
    BootingWorker,
    ColdStart,
    PhaseTimes,
    key_due,
    soonest,
    worth_publishing,
)
from control_plane.reconcile.env import Env
from control_plane.services.jobs import cold_starts, job_store
from control_plane.services.jobs.webhook_delivery import STARTING_EVENT
from control_plane.services.webhooks import signing
from control_plane.tasks_api import enqueue_webhook

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Case:
    """One deployment's workers as `scale` found them this tick."""

    deployment_id: str
    booting: list[Worker]  # booting for it (including those just started)
    ready: int  # serving workers
    times: PhaseTimes  # its measured phase times


def report_all(
    session: Session,
    env: Env,
    cases: list[Case],
    last: dict[str, ColdStart],
    stored: dict[str, tuple[ColdStart, float]],
    now: datetime,
) -> None:
    """Tell the waiting jobs of every deployment how its cold start goes, in a few round trips
    for all of them. Kept by the caller between ticks, per deployment: `last`, what its jobs
    were last told; `stored`, what its key says and since when."""
    under_way = [c for c in cases if c.booting and not c.ready]
    ids = {c.deployment_id for c in under_way}
    for c in cases:
        if c.deployment_id in ids:
            continue
        was_told = last.pop(c.deployment_id, None) is not None
        if stored.pop(c.deployment_id, None) is not None or was_told:
            cold_starts.forget(env.redis, c.deployment_id)
    if not under_way:
        return
    beats = iter(_beats(env.redis, [w for c in under_way for w in c.booting]))
    held = _held(env)
    starts: dict[str, ColdStart] = {}
    for c in under_way:
        views = [_view(w, next(beats), now, held.get(w.id)) for w in c.booting]
        start = soonest(views, c.times)
        assert start is not None
        starts[c.deployment_id] = start
    job_store.mark_starting_many(session, {d: s.reason for d, s in starts.items()})
    session.commit()
    # Events and keys change only on real news, and only then are the waiting jobs read (a
    # steady tick reads none of them); a key's reader counts its ETA down (`key_due`).
    t = now.timestamp()
    told = {d for d, start in starts.items() if worth_publishing(last.get(d), start)}
    new_phase = {d for d, start in starts.items() if d not in last or last[d].phase != start.phase}
    keys = [(d, start, t) for d, start in starts.items() if key_due(stored.get(d), start, t)]
    waiting = job_store.waiting_jobs(session, sorted(told | new_phase))
    try:
        cold_starts.publish_all(
            env.redis,
            [(starts[d], [w.id for w in waiting.get(d, [])]) for d in sorted(told)],
            keys,
        )
    except redis.RedisError as exc:
        log.warning("cold starts: progress not published (Redis: %s)", exc)
        return
    stored.update({d: (start, at) for d, start, at in keys})
    for d in new_phase:
        _webhooks(env, [w for w in waiting.get(d, []) if w.wants_starting], starts[d].phase)
    for d in told:
        last[d] = starts[d]


def _webhooks(env: Env, waiting: list[job_store.Waiting], phase: str) -> None:
    """`job.starting` for each new phase, to the jobs that asked for it (best effort)."""
    for w in waiting:
        try:
            msg_id = signing.message_id(w.id, "starting", w.attempt, phase)
            enqueue_webhook(env.celery, w.id, STARTING_EVENT, msg_id)
        except Exception:
            log.exception("could not enqueue the starting webhook of job %s", w.id)


def _beats(r: redis.Redis, booting: list[Worker]) -> list[Any]:
    try:
        return list(r.mget([worker_heartbeat_key(w.id) for w in booting]))
    except redis.RedisError:
        return [None] * len(booting)


def _held(env: Env) -> dict[str, str]:
    """The provider's workers held up before they start (best effort: progress only)."""
    try:
        return env.provider.waiting()
    except Exception as exc:
        log.warning("cold starts: could not ask the provider what waits: %s", exc)
        return {}


def _view(w: Worker, beat: Any, now: datetime, held: str | None = None) -> BootingWorker:
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
        held=held,
    )

"""A deployment's cold start under way, in Redis: written by the reconciler, read by the API.

publish_all(r, [(deployment_id, start, waiting), ...])
                          `starting` event to each waiting job + each deployment's key
read(r, deployment_id)    for GET /v1/jobs/{id}: ColdStart.public() | None
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import redis

from control_plane.domain.cold_start import ColdStart
from control_plane.services import events
from worker.protocol import EventType, cold_start_key

# GET /v1/jobs/{id} shows a cold start this long after the last tick that saw it under way.
COLD_START_TTL_S = 5


def publish_all(r: redis.Redis, starts: list[tuple[str, ColdStart, list[str]]]) -> None:
    """Tell each deployment's `waiting` jobs (their event streams) and later readers (its key)."""
    pipe = r.pipeline(transaction=False)
    for deployment_id, start, waiting in starts:
        events.publish_to(
            pipe, waiting, EventType.STARTING, {"reason": start.reason, **start.public()}
        )
        pipe.set(cold_start_key(deployment_id), json.dumps(start.public()), ex=COLD_START_TTL_S)
    pipe.execute()


def read(r: redis.Redis, deployment_id: str) -> dict[str, Any] | None:
    raw = r.get(cold_start_key(deployment_id))
    return None if raw is None else dict(json.loads(raw))


def forget(r: redis.Redis, deployment_id: str) -> None:
    with contextlib.suppress(redis.RedisError):  # it expires on its own
        r.delete(cold_start_key(deployment_id))

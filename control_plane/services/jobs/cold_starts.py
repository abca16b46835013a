"""A deployment's cold start under way, in Redis: written by the reconciler, read by the API.

publish_all(r, [(start, waiting), ...], [(deployment_id, start, at), ...])
                          `starting` event to each waiting job; each deployment's key
read(r, deployment_id, now_s)
                          for GET /v1/jobs/{id}: ColdStart.public() | None, its ETA counted
                          down from when the key was written
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import redis

from common.protocol import EventType, cold_start_key
from control_plane.domain.cold_start import ColdStart, aged
from control_plane.services.jobs import events

# GET /v1/jobs/{id} shows a cold start this long after the last tick that wrote it (one that
# still sees it under way writes it again within KEY_REWRITE_S).
COLD_START_TTL_S = 5
# The key's field with its time of writing (seconds since the epoch; not in the public JSON).
AT = "at"


def publish_all(
    r: redis.Redis,
    events_to: Sequence[tuple[ColdStart, list[str]]],
    keys: Sequence[tuple[str, ColdStart, float]],
) -> None:
    """Tell waiting jobs (their event streams) and later readers (each deployment's key,
    stamped with `at`), in one round trip."""
    pipe = r.pipeline(transaction=False)
    for start, waiting in events_to:
        events.publish_to(
            pipe, waiting, EventType.STARTING, {"reason": start.reason, **start.public()}
        )
    for deployment_id, start, at in keys:
        doc = {**start.public(), AT: at}
        pipe.set(cold_start_key(deployment_id), json.dumps(doc), ex=COLD_START_TTL_S)
    pipe.execute()


def read(r: redis.Redis, deployment_id: str, now_s: float) -> dict[str, Any] | None:
    raw = r.get(cold_start_key(deployment_id))
    if raw is None:
        return None
    doc = dict(json.loads(raw))
    at = doc.pop(AT, None)
    if isinstance(at, int | float) and isinstance(doc.get("eta_s"), int | float):
        doc["eta_s"] = aged(ColdStart(doc["phase"], float(doc["eta_s"])), now_s - at).eta_s
    return doc


def forget(r: redis.Redis, deployment_id: str) -> None:
    with contextlib.suppress(redis.RedisError):  # it expires on its own
        r.delete(cold_start_key(deployment_id))

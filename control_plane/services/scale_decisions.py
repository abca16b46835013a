"""The autoscaler's latest decision per deployment, where the API and operators can see it.

    publish   the reconciler, once per tick: each deployment's decision (JSON, with a TTL) and
              one count per decision in a per-reason counter; one Redis round trip
    latest    `GET /v1/deployments[/{name}]`'s `scaling` object (None: no recent decision)
    counts    reason → decisions taken with it, for `/metrics`

Best effort on both sides: a Redis failure loses a status, never a decision.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import redis

from worker.protocol import SCALE_DECISIONS_KEY, scale_decision_key

log = logging.getLogger(__name__)

# A decision older than this is gone (the reconciler stopped): `scaling` is null rather than
# stale. Long against the tick (≤ 2 s), short against a person reading it.
DECISION_TTL_S = 300


def publish(r: redis.Redis, decisions: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Store (deployment id, decision document) pairs and count them by reason."""
    if not decisions:
        return
    pipe = r.pipeline(transaction=False)
    by_reason: dict[str, int] = {}
    for deployment_id, doc in decisions:
        pipe.set(scale_decision_key(deployment_id), json.dumps(doc), ex=DECISION_TTL_S)
        by_reason[str(doc["reason"])] = by_reason.get(str(doc["reason"]), 0) + 1
    for reason, n in by_reason.items():
        pipe.hincrby(SCALE_DECISIONS_KEY, reason, n)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("scaling decisions not published (Redis: %s)", exc)


def latest(r: redis.Redis, deployment_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """deployment id → its latest decision document, for those that have a recent one."""
    if not deployment_ids:
        return {}
    try:
        values = r.mget([scale_decision_key(i) for i in deployment_ids])
    except redis.RedisError as exc:
        log.warning("scaling decisions unreadable (Redis: %s)", exc)
        return {}
    return {i: json.loads(v) for i, v in zip(deployment_ids, values, strict=True) if v}


def counts(r: redis.Redis) -> dict[str, int]:
    """Decision reason → decisions taken with it since Redis was last emptied."""
    raw: dict[bytes, bytes] = r.hgetall(SCALE_DECISIONS_KEY)  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}

"""The autoscaler's latest decision per deployment, where the API and operators can see it.

    publish   the reconciler, once per tick: each deployment's decision (JSON, with a TTL)
              when it changed or was last written REWRITE_S ago (`Written`), and one count per
              decision in a per-reason counter; one Redis round trip
    latest    `GET /v1/deployments[/{name}]`'s `scaling` object (None: no recent decision)
    counts    reason → decisions taken with it, for `/metrics`

Best effort on both sides: a Redis failure loses a status, never a decision.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from common.protocol import SCALE_DECISIONS_KEY, scale_decision_key

log = logging.getLogger(__name__)

# A decision older than this is gone (the reconciler stopped): `scaling` is null rather than
# stale. Long against the tick (≤ 2 s), short against a person reading it.
DECISION_TTL_S = 300
# An unchanged decision is written again this often (its `decided_at` moves, its TTL starts
# over). At a thousand deployments, writing every decision every tick was a tenth of the tick.
REWRITE_S = 30.0
# The one field that changes every tick without the decision changing.
DECIDED_AT = "decided_at"


@dataclass
class Written:
    """What `publish` last wrote, per deployment: the document without its `decided_at`, and
    when (seconds since the epoch). The reconciler keeps it between ticks; a new one (after a
    restart) writes every decision once."""

    docs: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)

    def due(
        self, decisions: Sequence[tuple[str, dict[str, Any]]], now_s: float
    ) -> list[tuple[str, dict[str, Any]]]:
        """The decisions to write now: changed, or unchanged for REWRITE_S."""
        out = []
        for deployment_id, doc in decisions:
            last = self.docs.get(deployment_id)
            if last is None or now_s - last[1] >= REWRITE_S or not _same(last[0], doc):
                out.append((deployment_id, doc))
        return out

    def wrote(self, decisions: Sequence[tuple[str, dict[str, Any]]], now_s: float) -> None:
        for deployment_id, doc in decisions:
            self.docs[deployment_id] = ({k: v for k, v in doc.items() if k != DECIDED_AT}, now_s)


def _same(last: dict[str, Any], doc: dict[str, Any]) -> bool:
    """`doc` says what `last` (stored without DECIDED_AT) said."""
    return len(doc) - (DECIDED_AT in doc) == len(last) and all(
        k == DECIDED_AT or last.get(k, _MISSING) == v for k, v in doc.items()
    )


_MISSING = object()


def publish(
    r: redis.Redis,
    decisions: Sequence[tuple[str, dict[str, Any]]],
    written: Written | None = None,
    now_s: float = 0.0,
) -> None:
    """Store (deployment id, decision document) pairs and count them all by reason; with
    `written`, only those it says are due (and it learns what was stored)."""
    if not decisions:
        return
    due = written.due(decisions, now_s) if written is not None else decisions
    pipe = r.pipeline(transaction=False)
    by_reason: dict[str, int] = {}
    for deployment_id, doc in due:
        pipe.set(scale_decision_key(deployment_id), json.dumps(doc), ex=DECISION_TTL_S)
    for _, doc in decisions:
        by_reason[str(doc["reason"])] = by_reason.get(str(doc["reason"]), 0) + 1
    for reason, n in by_reason.items():
        pipe.hincrby(SCALE_DECISIONS_KEY, reason, n)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("scaling decisions not published (Redis: %s)", exc)
        return
    if written is not None:
        written.wrote(due, now_s)


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

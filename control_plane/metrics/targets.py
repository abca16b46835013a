"""Where the workers' own /metrics are: Prometheus HTTP service discovery (`http_sd_configs`).

A worker serves its metrics on the address its provider chose (the local provider: a free
loopback port, passed by env; in a pod: the pod IP) and writes the address it bound into its
heartbeat (`common.protocol.HEARTBEAT_METRICS_FIELD`). The targets are the live workers (SQL)
whose heartbeat (Redis, expiring) names one, each labelled with its worker id, deployment,
tenant and accelerator. The answer is Prometheus' HTTP SD format:

    [{"targets": ["127.0.0.1:41237"],
      "labels": {"worker": "wrk_…", "deployment": "demo", "tenant": "ten_…", "accelerator": "cpu"}}]
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from common.protocol import HEARTBEAT_METRICS_FIELD, worker_heartbeat_key
from control_plane.db.models import Deployment
from control_plane.errors import Unavailable
from control_plane.services.workers import worker_records

# host:port, the host a name or an IPv4 / bracketed IPv6 address: anything else in a
# heartbeat is not handed to Prometheus.
_TARGET = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.\-]{0,252}):[0-9]{1,5}$")


@dataclass(frozen=True, slots=True)
class LiveWorker:
    worker_id: str  # the worker row's id
    deployment: str | None  # its deployment's name (None: a warm-pool worker)
    tenant_id: str  # whose it is (the platform's, for the pool)
    accelerator: str  # cpu, h100, ...


def read(session: Session, r: redis.Redis) -> list[dict[str, Any]]:
    """The target groups of the live workers that serve metrics now."""
    rows = worker_records.live(session)
    if not rows:
        return []
    ids = {w.deployment_id for w in rows if w.deployment_id}
    names = dict(
        session.execute(select(Deployment.id, Deployment.name).where(Deployment.id.in_(ids))).all()
    )
    try:
        beats = r.mget([worker_heartbeat_key(w.id) for w in rows])
    except redis.RedisError as exc:
        # An error, not an empty list: Prometheus keeps its last targets on a failed refresh.
        raise Unavailable(f"worker heartbeats unreadable (Redis: {exc})") from None
    live = [
        LiveWorker(w.id, names.get(w.deployment_id) if w.deployment_id else None, w.tenant_id,
                   w.accelerator)
        for w in rows
    ]  # fmt: skip
    return target_groups(live, beats)


def target_groups(
    live: Sequence[LiveWorker], beats: Sequence[bytes | str | None]
) -> list[dict[str, Any]]:
    """Pure: one group per live worker whose heartbeat names a valid metrics address."""
    groups = []
    for w, raw in zip(live, beats, strict=True):
        target = _target_of(raw)
        if target is None:
            continue
        labels = {"worker": w.worker_id, "tenant": w.tenant_id, "accelerator": w.accelerator}
        if w.deployment is not None:
            labels["deployment"] = w.deployment
        groups.append({"targets": [target], "labels": labels})
    return sorted(groups, key=lambda g: g["labels"]["worker"])


def _target_of(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None  # no heartbeat: gone, or not yet started
    try:
        beat = json.loads(raw)
    except ValueError:
        return None
    target = beat.get(HEARTBEAT_METRICS_FIELD) if isinstance(beat, dict) else None
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        return None
    port = int(target.rsplit(":", 1)[1])
    return target if 0 < port < 65536 else None

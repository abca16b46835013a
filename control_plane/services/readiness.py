"""Readiness of an API process: can it reach what every request needs (`GET /readyz`)?

Liveness (`/healthz`) only says the process answers; a load balancer or Kubernetes sends
traffic to a replica only once these checks pass, and stops while one fails (a replica cut off
from the database would otherwise answer every request with an error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from control_plane.services.storage import object_store, storage_access
from control_plane.settings import Settings

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 2.0  # per check: a probe that hangs is a failed probe


def check(sessions: sessionmaker[Session], r: redis.Redis, settings: Settings) -> dict[str, bool]:
    """Each dependency's reachability, by name (`database`, `redis`, `object_store`)."""
    probes: dict[str, Callable[[], Any]] = {
        "database": lambda: _database(sessions),
        "redis": lambda: r.ping(),
        "object_store": lambda: _store(settings),
    }
    out = {}
    for name, probe in probes.items():
        try:
            probe()
            out[name] = True
        except Exception as exc:  # the reason goes to the log, never to the caller
            log.warning("readiness: %s unreachable (%s)", name, type(exc).__name__)
            out[name] = False
    return out


def _database(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        session.execute(text("SELECT 1"))


def _store(settings: Settings) -> None:
    from botocore.exceptions import ClientError

    try:
        _store_client(settings).head_bucket(Bucket=settings.store_bucket)
    except ClientError as exc:
        # It answered: a bucket not made yet is made at the first upload (ensure_bucket).
        if object_store.error_code(exc) not in object_store.MISSING:
            raise


def _store_client(settings: Settings) -> Any:
    """The platform's own client, with short timeouts and no retries: a probe answers within
    its period (kept between probes: `storage.s3_client`)."""
    return storage_access.s3_client(
        storage_access.platform_access(settings), timeout_s=PROBE_TIMEOUT_S
    )

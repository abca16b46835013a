"""What every call reads before anything else — the caller's API key, the deployment it names,
its tenant's quota limits — cached in each API process and checked on every request against
one generation number in Redis.

    view = ctx.edge.view()                         # one Redis GET: the current generation
    who = view.principal(session, token)           # no SQL when cached at this generation
    dep = view.deployment(session, who.tenant_id, name)
    limits = view.limits(session, who.tenant_id)

An admission spares the GET: `recent_view()` is the cache at the generation this process read last,
unconfirmed, and the quota script that charges the call checks that generation in the same round
trip (`Quotas.admit(..., generation=...)`). A call whose generation moved meanwhile is charged
nothing and decided again on a `view()` (`services/jobs/admission.py`), and so is every call such a
view refused: whatever was decided on an unconfirmed view is either confirmed before anything is
written or decided again.

Any commit that changes an API key, a deployment or a tenant bumps the generation
(`install_invalidation`, a session hook: no call site can forget it), so the next request of
every API process reads the database again: a revoked key is refused on the next request, a
new deployment version is seen at once. Only successes are cached (a wrong key or a missing
deployment is looked up every time, as before). Redis unreachable: nothing is cached, every
request reads the database. `MAX_AGE_S` bounds an entry's life should a bump itself be lost
to a Redis failure right after a commit.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from common.protocol import EDGE_CACHE_GENERATION_KEY
from control_plane.db.models import ApiKey, Deployment, Tenant
from control_plane.domain.spec import Spec
from control_plane.services import deployments
from control_plane.services.tenants import api_keys

log = logging.getLogger(__name__)
MAX_AGE_S = 10.0
MAX_ENTRIES = 10_000  # per kind; past it the kind starts over (hostile key spraying is not cached)
_WATCHED = (ApiKey, Deployment, Tenant)
_CHANGED = "edge_cache_changed"  # Session.info flag: a watched row was written
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DeploymentRef:
    """A live deployment as a call needs it (a snapshot: never written back)."""

    id: str
    tenant_id: str
    name: str
    version: int
    spec: Spec

    @classmethod
    def of(cls, row: Deployment) -> DeploymentRef:
        return cls(row.id, row.tenant_id, row.name, row.version, row.spec)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's own quota limits; None = the platform's default."""

    requests_per_min: int | None
    tokens_per_min: int | None
    max_in_flight: int | None


class EdgeCache:
    """Per-process; thread-safe (entries are immutable, each kind is one dict)."""

    def __init__(self, r: redis.Redis, clock: Callable[[], float] = time.monotonic) -> None:
        self._redis = r
        self._clock = clock
        self._kinds: dict[str, dict[Any, tuple[int, float, Any]]] = {
            "key": {},
            "deployment": {},
            "tenant": {},
        }
        self._lock = threading.Lock()
        self._seen: int | None = None  # the generation last read (`recent_view`)

    def view(self) -> EdgeView:
        """The cache as of the current generation (None: Redis unreachable, read through)."""
        try:
            raw = self._redis.get(EDGE_CACHE_GENERATION_KEY)
        except redis.RedisError:
            log.warning("edge cache: generation unreadable; reading the database")
            return EdgeView(self, None)
        self._seen = int(raw or 0)
        return EdgeView(self, self._seen)

    def recent_view(self) -> EdgeView:
        """The cache as of the generation this process read last, with no round trip; not
        `fresh`: what it serves must be confirmed (see the module doc). Before any `view()`,
        a `view()`."""
        seen = self._seen
        return self.view() if seen is None else EdgeView(self, seen, fresh=False)

    def _lookup(self, kind: str, key: Any, generation: int | None, load: Callable[[], T]) -> T:
        if generation is None:
            return load()
        entries = self._kinds[kind]
        hit = entries.get(key)
        now = self._clock()
        if hit is not None and hit[0] == generation and now - hit[1] < MAX_AGE_S:
            value: T = hit[2]
            return value
        value = load()  # raises for a missing or refused thing: never cached
        with self._lock:
            if len(entries) >= MAX_ENTRIES:
                entries.clear()
            # Tagged with the generation read BEFORE the database: a change committed in
            # between has bumped it, so this entry is never served again.
            entries[key] = (generation, now, value)
        return value


@dataclass(frozen=True, slots=True)
class EdgeView:
    cache: EdgeCache
    generation: int | None
    # read from Redis for this view; False: the generation last seen (`recent_view`)
    fresh: bool = True

    def principal(self, session: Session, token: str) -> api_keys.Principal:
        # Keyed by a hash: the process keeps no usable secret in this cache.
        digest = hashlib.sha256(token.encode()).digest()
        return self.cache._lookup(
            "key", digest, self.generation, lambda: api_keys.authenticate(session, token)
        )

    def deployment(self, session: Session, tenant_id: str, name: str) -> DeploymentRef:
        return self.cache._lookup(
            "deployment",
            (tenant_id, name),
            self.generation,
            lambda: DeploymentRef.of(deployments.get(session, tenant_id, name)),
        )

    def limits(self, session: Session, tenant_id: str) -> TenantLimits:
        def load() -> TenantLimits:
            t = session.get(Tenant, tenant_id)
            if t is None:
                return TenantLimits(None, None, None)
            return TenantLimits(t.requests_per_min, t.tokens_per_min, t.max_in_flight)

        return self.cache._lookup("tenant", tenant_id, self.generation, load)


def install_invalidation(sessions: sessionmaker[Session], r: redis.Redis) -> None:
    """Bump the generation after every commit that wrote an API key, deployment or tenant."""

    @event.listens_for(sessions, "after_flush")
    def _note(session: Session, _ctx: Any) -> None:
        if any(
            isinstance(obj, _WATCHED) for obj in (*session.new, *session.dirty, *session.deleted)
        ):
            session.info[_CHANGED] = True

    @event.listens_for(sessions, "after_commit")
    def _bump(session: Session) -> None:
        if session.info.pop(_CHANGED, False):
            try:
                r.incr(EDGE_CACHE_GENERATION_KEY)
            except redis.RedisError:
                # Entries then live up to MAX_AGE_S; the change itself is committed.
                log.exception("edge cache: could not bump the generation after a change")

    @event.listens_for(sessions, "after_rollback")
    def _forget(session: Session) -> None:
        session.info.pop(_CHANGED, None)

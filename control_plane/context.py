"""Per-process resources of the API, built once in `create_app` and handed to routes and to
the services that orchestrate a request (`services/jobs/admission.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from control_plane.domain.clock import Clock, utc_now
from control_plane.services.deployments import Specs
from control_plane.services.jobs.local_ends import LocalEnds
from control_plane.services.jobs.outbox import Outbox
from control_plane.services.models.model_meta import ModelMetaCache
from control_plane.services.tenants.edge_cache import EdgeCache
from control_plane.services.tenants.quotas import Quotas
from control_plane.settings import Settings


@dataclass(frozen=True, slots=True)
class AppContext:
    settings: Settings  # this process's settings
    sessions: sessionmaker[Session]  # SQL session factory
    redis: redis.Redis  # sync client (thread-pool routes, event publishing)
    aredis: aioredis.Redis  # async client (blocking stream reads in async routes)
    celery: Celery  # producer of worker wake-ups and background tasks
    edge: EdgeCache  # the caller's key, deployment and quota limits, checked per request
    model_meta: ModelMetaCache  # context length, tokenizer, chat template per deployment version
    quotas: Quotas  # per-tenant rate and in-flight limits
    clock: Clock = field(default=utc_now)  # the time every route and service here uses
    ends: LocalEnds = field(default_factory=LocalEnds)  # sync callers waiting in this process
    specs: Specs = field(default_factory=Specs)  # deployments' current specs, for claims

    @property
    def outbox(self) -> Outbox:
        """Where finished jobs are announced (event streams, webhooks)."""
        return Outbox(self.redis, self.celery, self.ends)

"""What every reconciler is given: the process's settings and its handles on the outside."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from control_plane.providers.base import Provider
from control_plane.services.jobs.outbox import Outbox
from control_plane.settings import Settings


@dataclass(frozen=True, slots=True)
class Env:
    settings: Settings  # this process's settings (rates, intervals)
    redis: redis.Redis  # heartbeats, job event streams, cancel flags
    celery: Celery  # worker wake-ups and webhook tasks
    provider: Provider  # starts, stops and reaps workers

    @property
    def outbox(self) -> Outbox:
        return Outbox(self.redis, self.celery)

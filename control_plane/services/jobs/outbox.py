"""Where a job's end is announced once its row is committed (`finish.py` step 3): the event
streams and cancel flags in Redis, the webhook tasks, and a sync caller waiting in this process.

Its own module so that whoever builds one (the API's `AppContext`, the reconciler's `Env`)
depends only on these handles, not on the job path that uses them.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from control_plane.services.jobs.local_ends import LocalEnds


@dataclass(frozen=True, slots=True)
class Outbox:
    """Where a finished job is announced after its row is committed."""

    redis: redis.Redis  # job event streams and cancel flags
    celery: Celery  # webhook delivery tasks
    local: LocalEnds | None = None  # sync callers waiting in this process (the API's)

"""Across a Redis restart (a redis-server of the module's own, SIGKILLed and started again on its
port): jobs accepted while it was down are woken as soon as it is back, not at the next
redispatch sweep."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from common.protocol import deployment_queue
from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile.driver import REDISPATCH_EVERY, Reconciler
from control_plane.reconcile.env import Env
from control_plane.services.jobs.dispatch import make_celery, queue_depth
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER_TOKEN, deploy, submit, tenant_keys
from tests.integration.killable_redis import KillableRedis, killable_redis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KillableRedis]:
    with killable_redis(tmp_path / "redis") as s:
        yield s


@pytest.fixture
def settings(tmp_path: Path, server: KillableRedis) -> Settings:
    database_url = f"sqlite:///{tmp_path / 'platform.db'}"
    upgrade(database_url)
    return Settings(
        database_url=database_url,
        redis_url=server.url,
        worker_token=WORKER_TOKEN,
        validate_models=False,  # the deployed model does not exist; no worker loads it
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def loop(settings: Settings) -> Reconciler:
    from bench.reconciler_tick import RecordingProvider

    env = Env(
        settings,
        redis.Redis.from_url(settings.redis_url),
        make_celery(settings),
        RecordingProvider(),
    )
    return Reconciler(env, make_sessionmaker(make_engine(settings.database_url)))


def tick(loop: Reconciler, at: datetime) -> None:
    """One tick; one that fails on the dead Redis fails as the reconciler's loop lets it."""
    with contextlib.suppress(redis.RedisError):
        loop.tick(at)


def test_jobs_accepted_while_redis_was_down_are_woken_when_it_returns(
    client: TestClient, settings: Settings, server: KillableRedis, loop: Reconciler
) -> None:
    key = tenant_keys(settings.database_url)["a"]
    dep = deploy(client, key)
    t0 = datetime.now(UTC)
    tick(loop, t0)
    server.kill()
    accepted = [submit(client, key) for _ in range(3)]  # committed; their wake-ups lost
    tick(loop, t0 + timedelta(seconds=1))  # the reconciler's round trips fail
    server.start()
    tick(loop, t0 + timedelta(seconds=2))  # well before the sweep's REDISPATCH_EVERY
    assert timedelta(seconds=2) < REDISPATCH_EVERY
    depth = queue_depth(loop.env.celery, deployment_queue(dep["id"]))
    assert depth == len(accepted), "each job accepted during the outage woken on Redis' return"

"""Across a Redis restart (a redis-server of the test's own, SIGKILLed and started again on its
port): a job that ends while Redis is down reaches its waiting callers (a sync call, an SSE
stream) from its row, within seconds, with its true output; jobs accepted while it was down are
woken as soon as it is back, not at the next redispatch sweep."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from common.protocol import deployment_queue
from control_plane.api.app import create_app
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile.driver import REDISPATCH_EVERY, Reconciler
from control_plane.reconcile.env import Env
from control_plane.services.jobs.dispatch import make_celery, queue_depth
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER_TOKEN, deploy, h, submit, tenant_keys
from tests.integration.killable_redis import KillableRedis, killable_redis
from tests.integration.stream_helpers import Caller, Worker, raw_sse, two_apis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KillableRedis]:
    with killable_redis(tmp_path / "redis") as s:
        yield s


@pytest.fixture
def settings(sqlite_database_url: str, server: KillableRedis) -> Settings:
    return Settings(
        database_url=sqlite_database_url,
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


def test_a_job_that_ends_while_redis_is_down_reaches_its_callers_from_its_row(
    tmp_path: Path, server: KillableRedis
) -> None:
    """The end is published after the commit; with Redis down it is lost ("could not publish
    the end of 1 jobs"). The callers wait in another API process than the one the worker
    reports to, so only Redis or the row can tell them. Before: the stream stayed open on
    keep-alives for ever, the sync call waited out its whole wait_s (60 s here)."""
    with two_apis(tmp_path / "apis", server) as apis:
        worker = Worker(apis)
        run = {"input": {"prompt": "a"}, "wait_s": 60}
        url = f"{apis.caller}/v1/deployments/demo/run"
        sync = Caller(lambda: httpx.post(url, json=run, headers=h(apis.key), timeout=90))
        sync_job = worker.job_waiting()
        stream = Caller(lambda: raw_sse(apis, "b"))
        stream_job = worker.job_waiting(other_than={sync_job})
        attempts = {job: worker.claim(job) for job in (sync_job, stream_job)}
        worker.stream(stream_job, attempts[stream_job], "Hello there")
        time.sleep(1.5)  # the deltas reach the AOF (fsync every second) and the stream
        server.kill()
        for job, text in ((sync_job, "the sync answer"), (stream_job, "Hello there")):
            worker.complete(job, attempts[job], text)  # committed; its end's publish fails
        ended = time.monotonic()
        time.sleep(1.0)
        server.start()
        answer = sync.join(10)
        assert answer.status_code == 200 and answer.json()["output"]["text"] == "the sync answer"
        got = stream.join(10)
        assert got.events[-1][0] == "completed" and got.text == "Hello there"
        for caller in (sync, stream):
            assert caller.ended_at is not None and caller.ended_at - ended < 5.0
        worker.close()

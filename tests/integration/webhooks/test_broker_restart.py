"""The Celery worker rides out a broker restart: redis-server is SIGKILLed under it while it
holds a message unacknowledged (a webhook retry waiting for its countdown, as there always is
under traffic) and started again on the same port; the same worker process must go on and
deliver the next webhook.

Its own redis-server (the package's `env` shares the session's, which must not die) and
database; the API in process on them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from common.protocol import UNACKED_KEY
from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.services.jobs.dispatch import make_celery
from control_plane.settings import Settings
from control_plane.tasks_api import CONTROL_QUEUE, DELIVER_WEBHOOK_TASK
from tests.helpers import wait_for
from tests.integration.api_helpers import WORKER_TOKEN, h, tenant_keys
from tests.integration.killable_redis import KillableRedis, killable_redis
from tests.integration.webhooks.helpers import (
    Env,
    claim,
    complete,
    deploy,
    job,
    start_celery_worker,
    stop_celery_worker,
    submit,
    unique,
    verify,
)
from tests.integration.webhooks.receiver import Receiver


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KillableRedis]:
    with killable_redis(tmp_path_factory.mktemp("broker")) as server:
        yield server


@pytest.fixture(scope="module")
def own_env(tmp_path_factory: pytest.TempPathFactory, broker: KillableRedis) -> Iterator[Env]:
    d = tmp_path_factory.mktemp("broker-restart")
    database_url = f"sqlite:///{d / 'platform.db'}"
    upgrade(database_url)
    settings = Settings(
        database_url=database_url,
        redis_url=broker.url,
        worker_token=WORKER_TOKEN,
        webhook_allow_private=True,
        validate_models=False,  # the deployed model does not exist; no worker loads it
    )
    child_env = {
        **os.environ,
        "PLATFORM_DATABASE_URL": database_url,
        "PLATFORM_REDIS_URL": broker.url,
        "PLATFORM_WEBHOOK_ALLOW_PRIVATE": "true",
        "PLATFORM_WEBHOOK_TIMEOUT_S": "3",
    }
    log = d / "celery.log"
    worker = start_celery_worker(child_env, log, settings)
    receiver = Receiver()
    try:
        with TestClient(create_app(settings)) as client:
            yield Env(client, settings, receiver, worker, log)
    finally:
        receiver.close()
        stop_celery_worker(worker)


def test_the_celery_worker_rides_out_a_broker_restart(own_env: Env, broker: KillableRedis) -> None:
    env = own_env
    key = tenant_keys(env.settings.database_url)["a"]
    deploy(env, key)
    r = redis.Redis.from_url(broker.url)
    # A message the worker holds unacknowledged across the restart: a delivery whose countdown
    # runs past it (of a job that does not exist: it would do nothing when due).
    app = make_celery(env.settings)
    app.send_task(
        DELIVER_WEBHOOK_TASK,
        kwargs={"event_type": "job.completed", "msg_id": "msg_x", "attempt": 1, "job_id": "x"},
        queue=CONTROL_QUEUE,
        countdown=120,
    )
    env.wait("the worker holds the message", lambda: r.hlen(UNACKED_KEY) == 1)
    r.close()
    broker.restart()
    time.sleep(3.0)  # the worker's reconnect (kombu retries after 2 s)
    assert env.worker.poll() is None, f"the Celery worker exited:\n{env.tail()}"
    path = unique("/ok")
    jid = submit(env, key, env.receiver.url(path))
    complete(env, jid, claim(env, jid))
    env.wait("delivered", lambda: job(env, key, jid)["webhook_status"] == "delivered")
    got = wait_for(lambda: env.receiver.at(path), 5, what="the receiver's copy")
    secret = env.client.get("/v1/webhooks/secret", headers=h(key)).json()["secret"]
    assert verify(secret, got[0])["data"]["id"] == jid
    assert env.worker.poll() is None, "the same process delivered it"

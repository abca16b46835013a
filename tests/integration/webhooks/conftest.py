"""Webhooks end to end: the API in process, a real Celery worker process (never eager mode) on a
real Redis, real SQL, a real HTTP receiver; signatures checked with `standardwebhooks`.

The worker, the database and the receiver live for the whole package (starting a worker costs
seconds: `env` is package-scoped, so every module here shares one); every test uses fresh
tenants, so tests do not see each other's data."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.embedded.processes import free_port
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import WORKER_TOKEN, tenant_keys
from tests.integration.webhooks.helpers import (
    OUTPUT_INTERVAL_S,
    REDIS_DB,
    RETRY_SCHEDULE_S,
    Env,
    start_celery_worker,
    stop_celery_worker,
)
from tests.integration.webhooks.receiver import Receiver


@pytest.fixture(scope="package")
def env(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_server: S3Server
) -> Iterator[Env]:
    d = tmp_path_factory.mktemp("webhooks")
    database_url = f"sqlite:///{d / 'platform.db'}"
    upgrade(database_url)
    module_redis = redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.Redis.from_url(module_redis).flushdb()
    settings = Settings(
        database_url=database_url,
        redis_url=module_redis,
        s3_endpoint_url=s3_server.url,
        worker_token=WORKER_TOKEN,
        webhook_allow_private=True,
        results_bucket="results-webhooks",
        validate_models=False,  # the deployed model does not exist; no worker loads it
    )
    child_env = {
        **os.environ,
        **s3_server.env(),
        "PLATFORM_DATABASE_URL": database_url,
        "PLATFORM_REDIS_URL": module_redis,
        "PLATFORM_WEBHOOK_ALLOW_PRIVATE": "true",
        "PLATFORM_WEBHOOK_RETRY_SCHEDULE_S": RETRY_SCHEDULE_S,
        "PLATFORM_WEBHOOK_OUTPUT_INTERVAL_S": str(OUTPUT_INTERVAL_S),
        "PLATFORM_WEBHOOK_TIMEOUT_S": "3",
        "PLATFORM_METRICS_PORT": str(metrics_port := free_port()),
    }
    log = d / "celery.log"
    worker = start_celery_worker(child_env, log, settings)
    receiver = Receiver()
    aws = pytest.MonkeyPatch()
    for k, v in s3_server.env().items():
        aws.setenv(k, v)  # this process writes batch results too
    try:
        with TestClient(create_app(settings)) as client:
            yield Env(client, settings, receiver, worker, log, metrics_port)
    finally:
        aws.undo()
        receiver.close()
        stop_celery_worker(worker)


@pytest.fixture
def keys(env: Env) -> dict[str, str]:
    """Fresh tenants A and B (admin keys) and a read-only key of A, in the package's database."""
    return tenant_keys(env.settings.database_url)

"""Fixtures of the API integration tests: settings on the real Redis and SQL database (a
module that needs more overrides them: `settings.model_copy(update=...)`, or
api_helpers.on_s3 for the S3 server), tenants with keys, and the app in process (FastAPI
TestClient)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.reconciler_tick import RecordingProvider
from common import logs, tracing
from control_plane.api.app import create_app
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.env import Env
from control_plane.services.jobs.dispatch import make_celery
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER_TOKEN, operator_and_tenants, tenant_keys


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        worker_token=WORKER_TOKEN,
        sync_wait_default_s=0.5,
        webhook_allow_private=False,
        # These tests deploy models that do not exist (`deploy()` names store://models/demo/)
        # and run a recording provider that never loads weights; the deploy-time model check
        # is tested with real checkpoints in test_deploy_validation.py.
        validate_models=False,
    )


@pytest.fixture
def keys(settings: Settings) -> dict[str, str]:
    """Operator tenant A and tenant B with admin keys, and a read-only key of tenant A."""
    return tenant_keys(settings.database_url)


@pytest.fixture
def tenants(settings: Settings) -> dict[str, dict[str, str]]:
    """The operator's tenant `op` and two ordinary tenants `a` and `b`, with admin keys:
    name -> {id, key}."""
    return operator_and_tenants(settings.database_url)


class SteppedClock:
    """The API's and the reconciler's clock in tests: real time plus what the test added, so a
    test moves time forward (ttl, limits, billed seconds) without sleeping."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> datetime:
        self.offset += timedelta(seconds=seconds)
        return self()


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def client(settings: Settings, redis_client: Any, clock: SteppedClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings, clock=clock)) as c:
        yield c


@pytest.fixture
def loop(settings: Settings, redis_client: Any) -> Reconciler:
    """The reconciler on the real Redis and SQL, driven by `tick(now)` from the test;
    its provider records starts and stops instead of spawning processes."""
    sessions = make_sessionmaker(make_engine(settings.database_url))
    env = Env(
        settings,
        redis.Redis.from_url(settings.redis_url),
        make_celery(settings),
        RecordingProvider(),
    )
    return Reconciler(env, sessions)


def provider(loop: Reconciler) -> RecordingProvider:
    p = loop.env.provider
    assert isinstance(p, RecordingProvider)
    return p


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, every span in this in-memory exporter (off again after)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.install(None)
    provider.shutdown()


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """Every INFO+ line of the test as the JSON formatter writes it, at the time it is logged
    (the span and context current then)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter("test"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield out
    root.removeHandler(handler)
    root.setLevel(level)


def lines_of(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]

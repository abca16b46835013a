"""`/healthz` and `/readyz` against real dependencies: ready when the database, Redis and the
object store answer; 503 naming what does not (and never why); no key needed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import WORKER_TOKEN


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port nothing listens on while the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def app_client(tmp_path: Path, redis_url: str, s3_url: str) -> TestClient:
    db = f"sqlite:///{tmp_path / 'ready.db'}"
    upgrade(db)
    settings = Settings(
        database_url=db,
        redis_url=redis_url,
        worker_token=WORKER_TOKEN,
        s3_endpoint_url=s3_url,
        store_bucket="store-ready",  # not made yet: the store still answers
    )
    return TestClient(create_app(settings))


def test_ready_when_everything_answers(tmp_path: Path, redis_url: str, s3_env: S3Server) -> None:
    with app_client(tmp_path, redis_url, s3_env.url) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        r = client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["checks"] == {"database": "ok", "redis": "ok", "object_store": "ok"}


def test_not_ready_names_the_unreachable_dependency(
    tmp_path: Path, redis_url: str, s3_env: S3Server, dead_port: int
) -> None:
    with app_client(tmp_path, redis_url, f"http://127.0.0.1:{dead_port}") as client:
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.headers["content-type"].startswith("application/problem+json")
        body = r.json()
        assert body["checks"] == {"database": "ok", "redis": "ok", "object_store": "unreachable"}
        assert str(dead_port) not in r.text, "what failed, never how it is reached"
        assert client.get("/healthz").status_code == 200, "alive though not ready"


def test_redis_down_is_not_ready(tmp_path: Path, s3_env: S3Server, dead_port: int) -> None:
    with app_client(tmp_path, f"redis://127.0.0.1:{dead_port}/0", s3_env.url) as client:
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["redis"] == "unreachable"

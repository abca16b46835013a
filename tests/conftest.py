"""Shared fixtures: real servers (redis-server, rclone S3), a migrated SQL database, settings.

Servers start once per session and are stopped at the end; nothing is left running.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from control_plane.embedded.processes import free_port, start_redis, start_s3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
    # The vLLM modules first (minutes each): `make test` hands whole modules to its processes
    # in this order, each taking the next as it is done, and these last would run on alone.
    items.sort(key=lambda item: not item.nodeid.startswith("tests/vllm/"))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("redis")
    proc = start_redis(d, free_port(), d / "redis.log", appendonly=False)
    yield proc.extra["url"]
    proc.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[object]:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@dataclass(frozen=True)
class S3Server:
    url: str  # endpoint URL
    access_key: str
    secret_key: str
    root: Path  # directory served; each top-level directory is a bucket

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    d = tmp_path_factory.mktemp("s3")
    access, secret = "AKTEST" + secrets.token_hex(6).upper(), secrets.token_urlsafe(24)
    proc = start_s3(
        d / "objects", free_port(), access, secret, d / "rclone.log", buckets=("models", "test")
    )
    yield S3Server(proc.extra["url"], access, secret, d / "objects")
    proc.stop()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Point boto3 (through the standard AWS variables) at the test S3 server."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real PostgreSQL server started for this test session."""
    from tests.fixtures_postgres import postgres_bindir, start_postgres

    if postgres_bindir() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is missing on CI: .ci/run should have installed it")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    import shutil
    import tempfile

    # Not under pytest's tmp root: that is private to root, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="platform-test-pg-"))
    root.chmod(0o755)
    proc, url = start_postgres(root / "pg")
    yield url
    proc.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated once for the session. A test's database is a copy of it:
    a copy takes a millisecond, running the migrations half a second (and over a thousand
    tests ask for a migrated database)."""
    from control_plane.db.migrate import upgrade

    path = tmp_path_factory.mktemp("migrated") / "migrated.db"
    upgrade(f"sqlite:///{path}")  # (its engine pools no connection: the file is closed after)
    return path


@pytest.fixture
def sqlite_database_url(migrated_sqlite: Path, tmp_path: Path) -> str:
    """A migrated, empty SQLite database (for tests where the SQL database does not matter)."""
    path = tmp_path / "test.db"
    shutil.copyfile(migrated_sqlite, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def migrated_postgres(postgres_url: str) -> str:
    """The name of a PostgreSQL database migrated once for the session, the template of each
    test's (`fresh_database`), as `migrated_sqlite` is on SQLite."""
    from control_plane.db.migrate import upgrade
    from tests.fixtures_postgres import MIGRATED, create_database

    create_database(postgres_url, MIGRATED)
    upgrade(f"{postgres_url}/{MIGRATED}")
    return MIGRATED


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated, empty database: every test that uses it runs on SQLite and PostgreSQL."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_database_url")
        return
    from tests.fixtures_postgres import fresh_database

    server = request.getfixturevalue("postgres_url")
    yield from fresh_database(server, template=request.getfixturevalue("migrated_postgres"))

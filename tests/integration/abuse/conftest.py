"""The abuse suite: what a hostile client sends, against the real API in process on the real
Redis, SQL (SQLite and PostgreSQL) and S3 servers. Each test sends something the platform must
refuse (or survive) and checks the answer and that nothing was stored.

`send` posts a body as JSON text written with `json.dumps` (ASCII with `\\uXXXX` escapes), so a
lone surrogate travels exactly as a client in any language can send it; httpx's own `json=`
cannot encode one."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from control_plane.db.models import Base
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import h, on_s3

STORE_BUCKET = "abuse-store"
RESULTS_BUCKET = "abuse-results"


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    """The platform's store and results on the S3 server, the platform's real batch limits."""
    return on_s3(settings, s3_env, store_bucket=STORE_BUCKET, results_bucket=RESULTS_BUCKET)


@pytest.fixture(scope="package", autouse=True)
def s3_variables(s3_server: S3Server) -> Iterator[None]:
    """The S3 server's variables for the whole package, under each test's own (`s3_env`).
    A test's deploy starts a model prefetch on a thread that may still build an S3 client
    while the test's teardown removes the variables; boto3 then builds it without credentials
    and it is kept (services/storage/storage_access.py keys its clients by the variables it
    read first). With the variables never removed between these tests, that cannot happen."""
    saved = {k: os.environ.get(k) for k in s3_server.env()}
    os.environ.update(s3_server.env())
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def send(client: TestClient, method: str, path: str, body: Any, key: str) -> httpx.Response:
    """`body` as JSON text with every non-ASCII character escaped (`"\\ud800"` stays a lone
    surrogate's escape)."""
    headers = {**h(key), "Content-Type": "application/json"}
    return client.request(method, path, content=json.dumps(body), headers=headers)


class Rows:
    """Row counts of every table, to check that a refused request wrote nothing."""

    def __init__(self, settings: Settings) -> None:
        self.engine = make_engine(settings.database_url)
        self.sessions = make_sessionmaker(self.engine)

    def counts(self) -> dict[str, int]:
        with self.sessions() as s:
            return {
                t.name: int(s.scalar(select(func.count()).select_from(t)) or 0)
                for t in Base.metadata.sorted_tables
            }


@pytest.fixture
def rows(settings: Settings) -> Iterator[Rows]:
    r = Rows(settings)
    yield r
    r.engine.dispose()

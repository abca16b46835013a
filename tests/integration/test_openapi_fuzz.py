"""schemathesis against the served OpenAPI document: generated requests (valid and not) never
cause a 500, and every answer matches the documented schema and content type."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services import auth
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import WORKER_TOKEN


@pytest.fixture(scope="module")
def fuzz_app(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_server: S3Server
) -> Iterator[FastAPI]:
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('fuzz')) / 'fuzz.db'}"
    upgrade(db)
    engine = make_engine(db)
    now = datetime.now(UTC)
    with make_sessionmaker(engine)() as s:
        t = auth.create_tenant(s, "fuzz", now)
        t.is_operator = True
        s.flush()
        _, key = auth.create_api_key(s, t.id, {"admin"}, now)
        s.commit()
    engine.dispose()
    app = create_app(
        Settings(
            database_url=db,
            redis_url=redis_url,
            worker_token=WORKER_TOKEN,
            # No workers here: sync calls must answer fast (202 / 504), never hang.
            sync_wait_default_s=0.05,
            sync_wait_max_s=0.1,
            default_requests_per_min=100_000,
            s3_endpoint_url=s3_server.url,
            store_bucket="store-fuzz",
            upload_max_bytes=1_000_000,
            secret_key="fuzz-secret-key",
        )
    )
    app.state.fuzz_key = key
    with pytest.MonkeyPatch.context() as mp:  # the platform's storage credentials
        for name, value in s3_server.env().items():
            mp.setenv(name, value)
        yield app


def test_no_server_errors_and_schema_conformance(fuzz_app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    auth_header = {"Authorization": f"Bearer {fuzz_app.state.fuzz_key}"}
    checks = [
        schemathesis.checks.not_a_server_error,
        schemathesis.checks.response_schema_conformance,
        schemathesis.checks.content_type_conformance,
        schemathesis.checks.status_code_conformance,
    ]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
            def run(case: Any) -> None:
                case.headers = {**(case.headers or {}), **auth_header}
                case.call_and_validate(checks=checks)

            try:
                run()
            except Unsatisfiable:
                continue  # no invalid input exists for an operation without parameters
            except Exception as exc:
                raise AssertionError(
                    f"{operation.method.upper()} {operation.path} ({mode}): {exc}"
                ) from exc

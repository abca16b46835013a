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
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.tenants import api_keys
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import WORKER_TOKEN
from worker.model.demo import create_demo_model


@pytest.fixture(scope="module")
def fuzz_app(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_server: S3Server
) -> Iterator[FastAPI]:
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('fuzz')) / 'fuzz.db'}"
    upgrade(db)
    engine = make_engine(db)
    now = datetime.now(UTC)
    with make_sessionmaker(engine)() as s:
        t = api_keys.create_tenant(s, "fuzz", now)
        t.is_operator = True
        s.flush()
        _, key = api_keys.create_api_key(s, t.id, {"admin"}, now)
        other = api_keys.create_tenant(s, "other", now)
        s.flush()
        _, other_key = api_keys.create_api_key(s, other.id, {"admin"}, now)
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
    app.state.other_key = other_key  # a second tenant's: it must never see the first's things
    with pytest.MonkeyPatch.context() as mp:  # the platform's storage credentials
        for name, value in s3_server.env().items():
            mp.setenv(name, value)
        yield app


SEED_MODEL = "store://models/seed/"
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.status_code_conformance,
]


def test_no_server_errors_and_schema_conformance(fuzz_app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    auth_header = {"Authorization": f"Bearer {fuzz_app.state.fuzz_key}"}
    checks = CHECKS
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


def test_call_sequences_keep_to_the_schema_and_to_their_tenant(
    fuzz_app: FastAPI, tmp_path: Path
) -> None:
    """Stateful: sequences of calls chained through what earlier answers returned (a created
    deployment's name, a job's id, a batch's, an endpoint's: the links schemathesis infers
    from the schema), each answer checked as above; and each resource a sequence reads is
    read again with another tenant's key, which must get the 404 a missing one gets."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    operator = {"Authorization": f"Bearer {fuzz_app.state.fuzz_key}"}
    other = {"Authorization": f"Bearer {fuzz_app.state.other_key}"}

    @schema.hook
    def map_body(context: Any, body: Any) -> Any:
        # Random names and URIs are almost never a deployment the API accepts, and every
        # sequence starts from one: give each generated deployment a valid name and a model in
        # the tenant's namespace (the stateless test above covers the invalid ones).
        op = context.operation
        if op is None or (op.method.upper(), op.path) != ("POST", "/v1/deployments"):
            return body
        if not isinstance(body, dict):
            return body
        name = "d" + "".join(c for c in str(body.get("name", "")).lower() if c.isalnum())[:20]
        return {**body, "name": name, "model": SEED_MODEL, "accelerator": "cpu"}

    machine = schema.as_state_machine()
    assert len(machine.bundles) >= 10, "too few links between operations to chain calls"
    crossed: list[str] = []
    failures: list[str] = []

    model = sorted(create_demo_model(tmp_path / "seed", seed=0, train_steps=0).iterdir())
    client = TestClient(fuzz_app)
    tenant: dict[str, str] = {}  # the Authorization of the tenant of the sequence under way

    class Sequences(machine):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            # Each sequence starts from the same state (hypothesis replays a sequence's start
            # and insists it draws alike): a tenant of its own, created by the operator, with
            # the model every generated deployment names, and one deployment, job and batch
            # for the links from the lists to lead to.
            r = client.post("/v1/tenants", json={"name": "seq"}, headers=operator)
            assert r.status_code == 201, r.text
            tenant["Authorization"] = f"Bearer {r.json()['admin_key']['key']}"
            for f in model:
                path = f"{SEED_MODEL.removeprefix('store://')}{f.name}"
                r = client.put(f"/v1/files/{path}", content=f.read_bytes(), headers=tenant)
                assert r.status_code == 201, r.text
            for route, body in (
                ("/v1/deployments", {"name": "seed", "model": SEED_MODEL, "accelerator": "cpu"}),
                ("/v1/deployments/seed/jobs", {"input": {"prompt": "seed", "max_tokens": 2}}),
                ("/v1/batches", {"deployment": "seed", "inputs": [{"prompt": "seed"}]}),
            ):
                r = client.post(route, json=body, headers=tenant)
                assert r.status_code in (201, 202), r.text

        def before_call(self, case: Any) -> None:
            # the generated headers may hold an Authorization of their own: ours wins
            case.headers = {**(case.headers or {}), **tenant}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            # NOTE: failures are collected, not raised: a failing sequence replayed meets other
            # ids and times than the first time, which hypothesis reports as flaky instead
            where = f"{case.method} {case.formatted_path}"
            try:
                case.validate_response(response, checks=CHECKS)
            except Exception as exc:
                failures.append(f"{where} -> {response.status_code}: {exc}")
            if (
                case.method.upper() == "GET"
                and case.path_parameters
                and response.status_code == 200
            ):
                theirs = case.call(headers=other)
                if theirs.status_code != 404:
                    failures.append(f"{where} as another tenant -> {theirs.status_code}")
                crossed.append(case.operation.path)

    try:
        Sequences.run(
            settings=settings(
                max_examples=12,
                stateful_step_count=10,  # each sequence costs a tenant and a model upload
                deadline=None,
                suppress_health_check=list(HealthCheck),
            )
        )
    finally:
        client.close()
    assert not failures, "\n\n".join(failures[:5])
    # the sequences reached resources by the ids earlier calls returned
    assert crossed, "no sequence read back a resource it had created"

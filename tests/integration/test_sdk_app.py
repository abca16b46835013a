"""The SDK against the real control plane app in process (real Redis, SQLite and PostgreSQL):
deployments, jobs, idempotent retries after a lost answer, 429 + Retry-After, keys,
batches, the error mapping, and AsyncClient over ASGI.

Each test runs over both clients (the `twin` fixture of tests/unit/sdk/twin.py). They
talk to the app through the TestClient (which runs the app's event loop in its own thread),
adapted into an httpx transport; test_async_client_over_asgi uses httpx.ASGITransport too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.api.routes import batches as batches_routes
from control_plane.settings import Settings
from sdk import (
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    InvalidRequestError,
    JobFailed,
    NotFoundError,
    RateLimitError,
)
from tests.integration.api_helpers import WORKER, h
from tests.integration.test_quotas import tenant_key
from tests.unit.sdk.twin import Twin, twin

__all__ = ["twin"]  # a fixture, used by name

BASE = "http://testserver"
MODEL = "store://models/demo/"


@pytest.fixture
def app(settings: Settings, redis_client: Any) -> Iterator[TestClient]:
    """The app, with the batch routes mounted too until app.py does it itself."""
    application = create_app(settings)
    if "/v1/batches" not in {getattr(r, "path", "") for r in application.routes}:
        application.include_router(batches_routes.router)
    with TestClient(application) as tc:
        yield tc


class AppTransport(httpx.BaseTransport):
    """An httpx transport that hands each request to the app through starlette's TestClient.

    NOTE: the TestClient speaks httpx2, not httpx, so requests and answers are copied across;
    answers are read whole (fine for everything but endless event streams).
    """

    def __init__(self, app: TestClient) -> None:
        self.app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.app.request(
            request.method,
            str(request.url),
            headers=dict(request.headers),
            content=request.read(),
            follow_redirects=False,
        )
        return httpx.Response(
            answer.status_code,
            headers=answer.headers.multi_items(),
            content=answer.content,
            request=request,
        )


class LoseAnswers(httpx.BaseTransport):
    """The server gets and processes each matching request, but its first `count` answers are
    lost on the way back (a connection reset after the commit)."""

    def __init__(self, inner: httpx.BaseTransport, route: str, count: int = 1) -> None:
        self.inner = inner
        self.route = route
        self.count = count
        self.seen = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if f"{request.method} {request.url.path}" == self.route:
            self.seen += 1
            if self.count:
                self.count -= 1
                response.close()
                raise httpx.ReadError("connection reset by peer", request=request)
        return response


Connect = Callable[..., Client]


@pytest.fixture
def sdk(app: TestClient, twin: Twin) -> Connect:
    """`sdk(key, **options)`: the twin under test, talking to the app."""

    def connect(key: str, **options: Any) -> Client:
        options.setdefault("transport", AppTransport(app))
        options.setdefault("sleep", lambda _s: None)
        return twin.client(BASE, key, **options)

    return connect


def jobs_on_server(app: TestClient, key: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = app.get("/v1/jobs", headers=h(key)).json()["data"]
    return data


def test_deployments_crud(app: TestClient, keys: dict[str, str], sdk: Connect) -> None:
    with sdk(keys["a"]) as client:
        created = client.deployments.create(name="demo", model=MODEL, scaledown_window_s=5)
        assert (created.name, created.version, created.model) == ("demo", 1, MODEL)
        assert client.deployments.get("demo").spec["scaledown_window_s"] == 5
        updated = client.deployments.update("demo", {**created.spec, "max_workers": 2})
        assert updated.version == 2 and updated.spec["max_workers"] == 2
        assert [d.name for d in client.deployments.list()] == ["demo"]
        with pytest.raises(ConflictError):
            client.deployments.create(name="demo", model=MODEL)
        client.deployments.delete("demo")
        with pytest.raises(NotFoundError) as missing:
            client.deployments.get("demo")
        assert "demo" in str(missing.value)


def test_submit_get_list_cancel(app: TestClient, keys: dict[str, str], sdk: Connect) -> None:
    with sdk(keys["a"]) as client:
        client.deployments.create(name="demo", model=MODEL)
        job = client.submit("demo", {"prompt": "Hi", "max_tokens": 4})
        assert job.status == "queued" and job.id.startswith("job_")
        fetched = client.jobs.get(job.id)
        assert fetched.raw["input"]["prompt"] == "Hi" and fetched.deployment == "demo"
        assert fetched.raw["queue_position"] == 0, "first in line"
        assert [j.id for j in client.jobs.list(deployment="demo", status="queued")] == [job.id]
        assert client.jobs.cancel(job.id).status == "canceled"
        with pytest.raises(JobFailed) as ended:
            job.wait(timeout=5)
        assert ended.value.job_id == job.id and ended.value.status == "canceled"
        assert client.jobs.list(status="queued") == []


def test_a_create_whose_answer_is_lost_is_retried_into_the_same_object(
    app: TestClient, keys: dict[str, str], sdk: Connect
) -> None:
    """The connection drops after the server committed: the SDK sends the request again with
    the same Idempotency-Key and gets the object it already created, never a second one."""
    with sdk(keys["a"]) as admin:
        admin.deployments.create(name="demo", model=MODEL)

    lossy = LoseAnswers(AppTransport(app), "POST /v1/deployments/demo/jobs", count=2)
    with sdk(keys["a"], transport=lossy) as client:
        job = client.submit("demo", "Hi")
    assert lossy.seen == 3, "sent three times: two answers were lost"
    assert [j["id"] for j in jobs_on_server(app, keys["a"])] == [job.id], "one job, not three"

    lossy = LoseAnswers(AppTransport(app), "POST /v1/batches")
    with sdk(keys["a"], transport=lossy) as client:
        batch = client.batches.create(["a", "b"], deployment="demo")
        assert lossy.seen == 2
        assert [b.id for b in client.batches.list()] == [batch.id]
    assert len(jobs_on_server(app, keys["a"])) == 3, "the job and the batch's two"


def test_429_honours_retry_after_then_raises(
    app: TestClient, database_url: str, keys: dict[str, str], sdk: Connect
) -> None:
    key = tenant_key(database_url, requests_per_min=2)
    slept: list[float] = []
    with sdk(key, sleep=slept.append, max_retries=2) as client:
        client.deployments.create(name="demo", model=MODEL)
        client.submit("demo", "a")
        client.submit("demo", "b")
        with pytest.raises(RateLimitError) as limited:
            client.submit("demo", "c")
    retry_after = limited.value.retry_after
    assert retry_after is not None and retry_after >= 1
    assert len(slept) == 2 and all(s >= 1 for s in slept), "waited as the server said"
    assert len(jobs_on_server(app, key)) == 2, "nothing was created over the limit"


def test_keys_create_list_revoke(app: TestClient, keys: dict[str, str], sdk: Connect) -> None:
    with sdk(keys["a"]) as client:
        key = client.keys.create(name="ci", scopes=["read"])
        assert key.key and key.key.startswith("pk_") and key.scopes == ["read"]
        listed = {k.id: k for k in client.keys.list()}
        assert listed[key.id].name == "ci" and listed[key.id].key is None
        with sdk(key.key) as ci:
            assert ci.deployments.list() == []
            with pytest.raises(AuthenticationError) as forbidden:
                ci.deployments.create(name="demo", model=MODEL)
            assert forbidden.value.status == 403
            client.keys.revoke(key.id)
            with pytest.raises(AuthenticationError) as revoked:
                ci.deployments.list()
            assert revoked.value.status == 401
        assert {k.id: k for k in client.keys.list()}[key.id].revoked


def test_errors_name_what_was_wrong(app: TestClient, keys: dict[str, str], sdk: Connect) -> None:
    with sdk(keys["a"]) as client:
        with pytest.raises(NotFoundError) as unknown:
            client.submit("nope", "Hi")
        assert "nope" in str(unknown.value) and unknown.value.status == 404

        with pytest.raises(InvalidRequestError) as bad_spec:
            client.deployments.create(name="Bad_Name", model="gs://x", max_workers=0)
        fields = {e["field"] for e in bad_spec.value.errors}
        assert {"name", "model", "max_workers"} <= fields

        client.deployments.create(name="demo", model=MODEL)
        with pytest.raises(InvalidRequestError) as bad_input:
            client.submit("demo", {"prompt": "Hi", "max_tokens": 0})
        assert [e["field"] for e in bad_input.value.errors] == ["input.max_tokens"]

        with pytest.raises(NotFoundError) as no_job:
            client.jobs.get("job_missing")
        assert no_job.value.job_id == "job_missing"
        with pytest.raises(NotFoundError):
            client.jobs.get(client.submit("demo", "x").id + "0")

    with sdk("pk_wrong_secret") as stranger, pytest.raises(AuthenticationError) as e:
        stranger.deployments.list()
    assert e.value.status == 401


def test_batches_get_list_results_cancel(
    app: TestClient, keys: dict[str, str], sdk: Connect
) -> None:
    with sdk(keys["a"]) as client:
        client.deployments.create(name="demo", model=MODEL)
        batch = client.batches.create(
            [{"prompt": "a"}, "b", "c"], deployment="demo", max_in_flight=2
        )
        assert batch.status == "running" and batch.total == 3
        assert batch.counts["queued"] == 3

        # One job finishes (through the worker's internal endpoints).
        first = client.jobs.list(status="queued")[-1]
        claim = app.post(
            f"/internal/jobs/{first.id}/claim", json={"worker_id": "w1"}, headers=WORKER
        )
        done = {"worker_id": "w1", "attempt": claim.json()["attempt"], "status": "succeeded"}
        done["output"] = {"text": "A", "finish_reason": "stop"}
        assert app.post(f"/internal/jobs/{first.id}/complete", json=done, headers=WORKER).is_success

        assert batch.refresh().finished == 1
        with client.batches.results(batch.id) as results:
            lines = list(results)
        assert results.status == "running"
        assert [(x["job_id"], x["status"], x["output"]["text"]) for x in lines] == [
            (first.id, "succeeded", "A")
        ]

        with pytest.raises(InvalidRequestError) as bad_line:
            client.batches.create(
                [{"prompt": "ok"}, {"prompt": "x", "max_tokens": 0}], deployment="demo"
            )
        assert bad_line.value.errors[0]["line"] == 2

        canceled = client.batches.cancel(batch.id)
        assert canceled.status == "canceled" and canceled.counts["canceled"] == 2
        assert client.batches.wait(batch.id, timeout=5).status == "canceled"
        assert [b.id for b in client.batches.list(deployment="demo")] == [batch.id]


def test_async_client_over_asgi(app: TestClient, keys: dict[str, str]) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app.app)
        async with AsyncClient(BASE, keys["a"], transport=transport) as client:
            created = await client.deployments.create(name="demo", model=MODEL)
            assert created.version == 1
            job = await client.submit("demo", "Hi", idempotency_key="order-1")
            again = await client.submit("demo", "Hi", idempotency_key="order-1")
            assert again.id == job.id
            assert (await client.jobs.get(job.id)).status == "queued"
            assert (await client.jobs.cancel(job.id)).status == "canceled"
            key = await client.keys.create(name="async")
            assert key.id in [k.id for k in await client.keys.list()]
            await client.keys.revoke(key.id)
            batch = await client.batches.create(["a"], deployment="demo")
            assert (await client.batches.cancel(batch.id)).status == "canceled"
            results = await client.batches.results(batch.id)
            assert [line["status"] async for line in results] == ["canceled"]
            with pytest.raises(NotFoundError):
                await client.deployments.get("nope")

    asyncio.run(main())

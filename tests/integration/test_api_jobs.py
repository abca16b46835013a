"""Jobs through the API in process against a real Redis and a real SQL database: a sync run
without capacity (202), bad input and private webhooks refused without side effects,
idempotency keys (and the race between two calls with one), tenant isolation, cancel, and
listing newest first."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from common.job_input import JobInput
from control_plane.db.models import Deployment, Job
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.errors import Conflict
from control_plane.services.jobs import job_store
from control_plane.services.tenants.edge_cache import DeploymentRef
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER, deploy, h


def test_sync_run_without_capacity_returns_202_with_job(
    client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"])
    r = client.post(
        "/v1/deployments/demo/run",
        json={"input": {"prompt": "hi"}, "wait_s": 0.2},
        headers=h(keys["a"]),
    )
    assert r.status_code == 202
    job = r.json()
    assert r.headers["X-Job-Id"] == job["id"]
    assert job["status"] == "queued"
    assert job["input"] == {
        "prompt": "hi",
        "max_tokens": 64,
        "temperature": 0.0,
        "top_p": 1.0,
        "stop": [],
    }


def test_bad_input_is_422_without_side_effect(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    r = client.post(
        "/v1/deployments/demo/jobs",
        json={"input": {"prompt": "x", "max_tokens": 0}},
        headers=h(keys["a"]),
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "input.max_tokens"
    assert client.get("/v1/jobs", headers=h(keys["a"])).json()["data"] == []
    r = client.post(
        "/v1/deployments/nope/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    )
    assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_webhook_to_loopback_is_refused_by_default(
    client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"])
    for url in (
        "http://127.0.0.1:9/hook",
        "http://169.254.169.254/latest",
        "http://10.0.0.1/x",
        "http://localhost/x",
    ):
        r = client.post(
            "/v1/deployments/demo/jobs",
            json={"input": {"prompt": "x"}, "webhook": url},
            headers=h(keys["a"]),
        )
        assert r.status_code == 422, (url, r.text)
    assert client.get("/v1/jobs", headers=h(keys["a"])).json()["data"] == []


def test_idempotency_key(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    body = {"input": {"prompt": "same"}}
    hdr = {**h(keys["a"]), "Idempotency-Key": "k-1"}
    first = client.post("/v1/deployments/demo/jobs", json=body, headers=hdr)
    second = client.post("/v1/deployments/demo/jobs", json=body, headers=hdr)
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    other = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "else"}}, headers=hdr
    )
    assert other.status_code == 409
    # a key is the tenant's own: another tenant's call with it is a call of its own
    deploy(client, keys["b"])
    theirs = client.post(
        "/v1/deployments/demo/jobs", json=body, headers={**h(keys["b"]), "Idempotency-Key": "k-1"}
    )
    assert theirs.status_code == 202 and theirs.json()["id"] != first.json()["id"]


def test_a_keyed_insert_that_loses_the_race_answers_with_the_winner(
    client: TestClient, keys: dict[str, str], settings: Settings
) -> None:
    """Two calls with one key, both past the lookup (`replay_of` found nothing for either):
    the second's INSERT meets the unique key and it answers with the first's job."""
    deploy(client, keys["a"])
    body = {"input": {"prompt": "same"}}
    hdr = {**h(keys["a"]), "Idempotency-Key": "k-race"}
    first = client.post("/v1/deployments/demo/jobs", json=body, headers=hdr).json()
    with make_sessionmaker(make_engine(settings.database_url))() as s:
        row = s.get(Job, first["id"])
        assert row is not None
        dep = DeploymentRef.of(s.get(Deployment, row.deployment_id))  # type: ignore[arg-type]
        now = datetime.now(UTC)
        job_input = JobInput.from_dict(row.input)
        job, created = job_store.create(s, dep, job_input, "async", now, idempotency_key="k-race",
                                        request_hash=row.request_hash, replay=None)  # fmt: skip
        assert (job.id, created) == (first["id"], False)
        with pytest.raises(Conflict):  # the same key with another body, in the same race
            job_store.create(s, dep, job_input, "async", now, idempotency_key="k-race",
                             request_hash="another", replay=None)  # fmt: skip
    listed = client.get("/v1/jobs", headers=h(keys["a"])).json()["data"]
    assert [j["id"] for j in listed] == [first["id"]]


def test_tenant_isolation(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    job = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    ).json()
    assert client.get(f"/v1/jobs/{job['id']}", headers=h(keys["b"])).status_code == 404
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=h(keys["b"])).status_code == 404
    assert client.get("/v1/deployments/demo", headers=h(keys["b"])).status_code == 404
    assert client.get("/v1/jobs", headers=h(keys["b"])).json()["data"] == []


def test_cancel_is_final(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    jid = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    ).json()["id"]
    r = client.post(f"/v1/jobs/{jid}/cancel", headers=h(keys["a"]))
    assert r.status_code == 200 and r.json()["status"] == "canceled"
    assert (
        client.post(
            f"/internal/jobs/{jid}/claim", json={"worker_id": "w"}, headers=WORKER
        ).status_code
        == 409
    )


def test_list_jobs_paginates_newest_first(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    ids = [
        client.post(
            "/v1/deployments/demo/jobs", json={"input": {"prompt": str(i)}}, headers=h(keys["a"])
        ).json()["id"]
        for i in range(5)
    ]
    page1 = client.get("/v1/jobs?limit=2", headers=h(keys["a"])).json()
    page2 = client.get(
        f"/v1/jobs?limit=2&cursor={page1['next_cursor']}", headers=h(keys["a"])
    ).json()
    page3 = client.get(
        f"/v1/jobs?limit=2&cursor={page2['next_cursor']}", headers=h(keys["a"])
    ).json()
    got = [j["id"] for p in (page1, page2, page3) for j in p["data"]]
    assert got == list(reversed(ids)) and page3["next_cursor"] is None

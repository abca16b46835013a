"""The API in process (FastAPI TestClient) against a real Redis and a real SQL database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from common.protocol import job_events_key
from control_plane.api.app import create_app
from control_plane.db.models import Deployment, Job, JobAttempt
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.errors import Conflict
from control_plane.services.jobs import job_store
from control_plane.services.tenants.edge_cache import DeploymentRef
from control_plane.settings import Settings
from tests.integration.api_helpers import SPEC, WORKER, deploy, h


def test_auth_is_required_and_problem_json(client: TestClient) -> None:
    r = client.get("/v1/deployments")
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["status"] == 401
    r = client.get("/v1/deployments", headers=h("pk_nothere_secret"))
    assert r.status_code == 401


def test_scopes_are_enforced(client: TestClient, keys: dict[str, str]) -> None:
    r = client.post("/v1/deployments", json=SPEC, headers=h(keys["ro"]))
    assert r.status_code == 403
    assert "deploy" in r.json()["detail"]


def test_deployment_lifecycle(client: TestClient, keys: dict[str, str]) -> None:
    dep = deploy(client, keys["a"])
    assert dep["version"] == 1 and dep["workers"] == {}
    again = client.post("/v1/deployments", json=SPEC, headers=h(keys["a"]))
    assert again.status_code == 409
    upd = client.put("/v1/deployments/demo", json={**SPEC, "max_workers": 2}, headers=h(keys["a"]))
    assert upd.status_code == 200 and upd.json()["version"] == 2
    same = client.put("/v1/deployments/demo", json={**SPEC, "max_workers": 2}, headers=h(keys["a"]))
    assert same.json()["version"] == 2, "an unchanged spec is not a new version"
    assert [
        d["name"] for d in client.get("/v1/deployments", headers=h(keys["a"])).json()["data"]
    ] == ["demo"]
    assert client.delete("/v1/deployments/demo", headers=h(keys["a"])).status_code == 204
    r = client.get("/v1/deployments/demo", headers=h(keys["a"]))
    assert r.status_code == 404 and "demo" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SPEC, "name": "Bad Name"}, "name"),
        ({**SPEC, "model": "ftp://x/y"}, "model"),
        ({**SPEC, "min_workers": 3, "max_workers": 1}, "body"),
        ({**SPEC, "surprise": 1}, "surprise"),
        ({**SPEC, "accelerator": "tpu9"}, "accelerator"),
    ],
)
def test_bad_deployment_specs_name_the_field(
    client: TestClient, keys: dict[str, str], body: dict[str, Any], field: str
) -> None:
    r = client.post("/v1/deployments", json=body, headers=h(keys["a"]))
    assert r.status_code == 422, r.text
    assert any(e["field"] == field for e in r.json()["errors"]), r.json()
    assert client.get("/v1/deployments", headers=h(keys["a"])).json()["data"] == []


def test_a_gpu_type_the_platform_does_not_list_is_refused(
    settings: Settings, redis_client: Any, clock: Any, keys: dict[str, str]
) -> None:
    """Priced, but not among PLATFORM_ACCELERATORS: no node selector or device would place it
    (the kubernetes provider would schedule it on any GPU node)."""
    listed = settings.model_copy(update={"accelerators": {"h100": 8}})
    with TestClient(create_app(listed, clock=clock)) as c:
        r = c.post("/v1/deployments", json={**SPEC, "accelerator": "a100"}, headers=h(keys["a"]))
        assert r.status_code == 422, r.text
        assert r.json()["errors"] == [{"field": "accelerator", "message": "one of ['cpu', 'h100']"}]
        for ok in ("h100", "cpu"):
            body = {**SPEC, "name": f"on-{ok}", "accelerator": ok}
            assert c.post("/v1/deployments", json=body, headers=h(keys["a"])).status_code == 201


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
        job, created = job_store.create(s, dep, row.input, "async", now, idempotency_key="k-race",
                                   request_hash=row.request_hash, replay=None)  # fmt: skip
        assert (job.id, created) == (first["id"], False)
        with pytest.raises(Conflict):  # the same key with another body, in the same race
            job_store.create(s, dep, row.input, "async", now, idempotency_key="k-race",
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


def test_claim_and_complete_are_fenced(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    job = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    ).json()
    jid = job["id"]
    assert client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w"}).status_code == 401
    c1 = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w1"}, headers=WORKER)
    assert c1.status_code == 200 and c1.json()["attempt"] == 1
    # A second claim of a running job is refused (no double execution).
    assert (
        client.post(
            f"/internal/jobs/{jid}/claim", json={"worker_id": "w2"}, headers=WORKER
        ).status_code
        == 409
    )
    stale = {"worker_id": "w1", "attempt": 0, "status": "succeeded", "output": {"text": "old"}}
    assert (
        client.post(f"/internal/jobs/{jid}/complete", json=stale, headers=WORKER).status_code == 409
    )
    good = {
        **stale,
        "attempt": 1,
        "output": {"text": "new", "finish_reason": "stop"},
        "prompt_tokens": 2,
        "generated_tokens": 1,
    }
    assert (
        client.post(f"/internal/jobs/{jid}/complete", json=good, headers=WORKER).status_code == 200
    )
    again = {**good, "status": "failed"}
    assert (
        client.post(f"/internal/jobs/{jid}/complete", json=again, headers=WORKER).status_code == 409
    )
    final = client.get(f"/v1/jobs/{jid}", headers=h(keys["a"])).json()
    assert final["status"] == "succeeded" and final["output"]["text"] == "new"
    assert final["usage"]["prompt_tokens"] == 2 and final["attempt"] == 1


def test_a_claim_retried_by_its_worker_gets_the_same_attempt(
    client: TestClient, keys: dict[str, str], redis_client: Any
) -> None:
    """The API died after committing a claim, before answering it: the worker's retry must
    get the job it holds (refused, the job would stay `running` with nobody running it)."""
    deploy(client, keys["a"])
    job = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    ).json()
    path = f"/internal/jobs/{job['id']}/claim"
    first = client.post(path, json={"worker_id": "w1"}, headers=WORKER)
    again = client.post(path, json={"worker_id": "w1"}, headers=WORKER)
    assert first.status_code == again.status_code == 200
    assert first.json()["attempt"] == again.json()["attempt"] == 1
    # the claim's effects happened once: one `running` event in the job's stream
    events = redis_client.xrange(job_events_key(job["id"]))
    assert [e[b"type"] for _, e in events].count(b"running") == 1
    assert client.post(path, json={"worker_id": "w2"}, headers=WORKER).status_code == 409
    done = {"worker_id": "w1", "attempt": 1, "status": "succeeded", "output": {"text": "ok"}}
    assert client.post(f"/internal/jobs/{job['id']}/complete", json=done, headers=WORKER)
    # once it ended, its own worker cannot claim it either
    assert client.post(path, json={"worker_id": "w1"}, headers=WORKER).status_code == 409
    final = client.get(f"/v1/jobs/{job['id']}", headers=h(keys["a"])).json()
    assert (final["status"], final["attempt"]) == ("succeeded", 1)


def test_every_claim_writes_the_job_and_its_attempt_alike(
    client: TestClient, keys: dict[str, str], settings: Settings
) -> None:
    """A queued job without a ttl is claimed by one UPDATE returning its row (the warm path);
    a job that waited for a boot, one with a ttl, and one requeued after a lost worker go the
    longer way or keep what they had. Each ends up as the claim's answer says: running, the
    next attempt, its first start kept, the attempt recorded with its boot wait."""
    deploy(client, keys["a"])

    def submit(**extra: Any) -> str:
        body = {"input": {"prompt": "x"}, **extra}
        r = client.post("/v1/deployments/demo/jobs", json=body, headers=h(keys["a"]))
        return str(r.json()["id"])

    queued, booted, with_ttl, requeued = submit(), submit(), submit(ttl_s=600), submit()
    sessions = make_sessionmaker(make_engine(settings.database_url))
    first_start = datetime(2026, 1, 1, tzinfo=UTC)
    with sessions() as s:
        s.get(Job, booted).status = "starting"  # type: ignore[union-attr]
        lost = s.get(Job, requeued)
        assert lost is not None
        lost.attempt, lost.started_at, lost.status_reason = 1, first_start, "worker_lost"
        s.commit()
    answers = {
        jid: client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w1"}, headers=WORKER)
        for jid in (queued, booted, with_ttl, requeued)
    }
    with sessions() as s:
        for jid, answer in answers.items():
            row = s.get(Job, jid)
            assert row is not None and answer.status_code == 200
            assert answer.json()["attempt"] == row.attempt == (2 if jid == requeued else 1)
            assert (row.status, row.worker_id, row.status_reason) == ("running", "w1", None)
            assert row.started_at is not None
            if jid == requeued:
                assert row.started_at == first_start
            assert row.ttl_s == (600 if jid == with_ttl else None)
            attempt = s.scalars(
                select(JobAttempt).where(
                    JobAttempt.job_id == jid, JobAttempt.attempt == row.attempt
                )
            ).one()
            assert (attempt.worker_id, attempt.boot_wait) == ("w1", jid == booted)
    # claimed: nobody else gets them, and their worker gets the same attempts again
    for jid in answers:
        path = f"/internal/jobs/{jid}/claim"
        assert client.post(path, json={"worker_id": "w2"}, headers=WORKER).status_code == 409
        again = client.post(path, json={"worker_id": "w1"}, headers=WORKER).json()
        assert again["attempt"] == answers[jid].json()["attempt"]


def test_a_claim_answers_with_the_deployments_current_spec(
    client: TestClient, keys: dict[str, str]
) -> None:
    """The claim's execution limit is the deployment's spec at the claim (the API process
    caches specs by version): an update is seen by the next claim, a job queued before it
    included; a job's own limit wins over the deployment's."""

    def submit(**body: Any) -> str:
        r = client.post(
            "/v1/deployments/demo/jobs",
            json={"input": {"prompt": "x"}, **body},
            headers=h(keys["a"]),
        )
        assert r.status_code == 202, r.text
        job_id: str = r.json()["id"]
        return job_id

    def claim(job_id: str) -> dict[str, Any]:
        r = client.post(f"/internal/jobs/{job_id}/claim", json={"worker_id": "w"}, headers=WORKER)
        assert r.status_code == 200, r.text
        answer: dict[str, Any] = r.json()
        return answer

    deploy(client, keys["a"], execution_timeout_s=30)
    first, queued, own = submit(), submit(), submit(execution_timeout_s=3)
    assert claim(first)["execution_timeout_s"] == 30
    assert claim(first)["deployment"] == "demo"  # (claimed again by its worker: the same)
    r = client.put(
        "/v1/deployments/demo", json={**SPEC, "execution_timeout_s": 45}, headers=h(keys["a"])
    )
    assert r.json()["version"] == 2
    assert claim(queued)["execution_timeout_s"] == 45
    assert claim(submit())["execution_timeout_s"] == 45
    assert claim(own)["execution_timeout_s"] == 3
    r = client.put(
        "/v1/deployments/demo", json={**SPEC, "execution_timeout_s": 30}, headers=h(keys["a"])
    )
    assert r.json()["version"] == 3  # the same spec as version 1, a version of its own
    assert claim(submit())["execution_timeout_s"] == 30


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


def test_worker_phases_become_billing_records_once(
    client: TestClient, keys: dict[str, str], settings: Settings
) -> None:
    from control_plane.db.models import Deployment
    from control_plane.services.workers import worker_records

    deploy(client, keys["a"])
    engine = make_engine(settings.database_url)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with make_sessionmaker(engine)() as s:
        dep = s.query(Deployment).one()
        w = worker_records.create(s, dep, "cpu", "test", t0)
        s.commit()
        wid = w.id
    engine.dispose()
    base = t0.timestamp()
    for state, dt in [
        ("loading", 2.5),
        ("warming", 4.0),
        ("idle", 4.25),
        ("busy", 10.0),
        ("idle", 11.0),
        ("draining", 20.0),
        ("stopped", 20.5),
    ]:
        body = {"state": state, "at": base + dt}
        assert (
            client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER).status_code
            == 200
        )
        # A replayed report changes nothing.
        client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER)
    recs = client.get(f"/v1/billing/records?worker_id={wid}", headers=h(keys["a"])).json()["data"]
    assert [(r["phase"], r["seconds"]) for r in recs] == [
        ("boot", "2.500"),
        ("load", "1.500"),
        ("warm", "0.250"),
        ("idle", "5.750"),
        ("busy", "1.000"),
        ("idle", "9.000"),
        ("drain", "0.500"),
    ]
    from decimal import Decimal

    total = sum(Decimal(r["amount"]) for r in recs)
    assert total == Decimal("20.5") * settings.rate_per_s("cpu")
    assert (
        client.get(f"/v1/billing/records?worker_id={wid}", headers=h(keys["b"])).json()["data"]
        == []
    )


def test_openapi_is_served(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "/v1/deployments/{name}/run" in spec["paths"]
    assert not any(p.startswith("/internal") for p in spec["paths"])

"""The workers' internal routes through the API in process against a real Redis and a real SQL
database: claims and completions fenced by attempt, a claim retried by its own worker, what
every claim writes, the spec a claim answers with, and state reports becoming billing records."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from common.protocol import job_events_key
from control_plane.db.models import Job, JobAttempt
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.settings import Settings
from tests.integration.api_helpers import SPEC, WORKER, deploy, h


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


def test_a_jobs_error_names_the_tenants_store_paths(
    client: TestClient, keys: dict[str, str], settings: Settings
) -> None:
    deploy(client, keys["a"])
    job = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    ).json()
    claimed = client.post(
        f"/internal/jobs/{job['id']}/claim", json={"worker_id": "w1"}, headers=WORKER
    )
    assert claimed.status_code == 200
    sessions = make_sessionmaker(make_engine(settings.database_url))
    with sessions() as session:
        tenant_id = session.scalar(select(Job.tenant_id).where(Job.id == job["id"]))
    internal = f"s3://{settings.store_bucket}/tenants/{tenant_id}/"
    error = {"type": "model_error", "message": f"OSError: {internal}models/x/a.bin: gone"}
    failed = {"worker_id": "w1", "attempt": 1, "status": "failed", "error": error}
    done = client.post(f"/internal/jobs/{job['id']}/complete", json=failed, headers=WORKER)
    assert done.status_code == 200, done.text
    shown = client.get(f"/v1/jobs/{job['id']}", headers=h(keys["a"])).json()["error"]
    assert shown["message"] == "OSError: store://models/x/a.bin: gone"

"""A worker's claims and reports of several jobs in one request (`/internal/jobs/claim`,
`/internal/jobs/complete`): answered per job, fenced per job, one transaction."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from common.protocol import CLAIMS_PATH, MAX_JOBS_PER_REQUEST, REPORTS_PATH, job_events_key
from tests.integration.api_helpers import WORKER, deploy, h
from tests.integration.conftest import SteppedClock


def _submit(client: TestClient, key: str, **extra: Any) -> str:
    r = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}, **extra}, headers=h(key)
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _job(client: TestClient, key: str, jid: str) -> dict[str, Any]:
    r = client.get(f"/v1/jobs/{jid}", headers=h(key))
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_claim_of_several_jobs_answers_each(
    client: TestClient, keys: dict[str, str], clock: SteppedClock, redis_client: Any
) -> None:
    deploy(client, keys["a"])
    fresh, taken, late = (_submit(client, keys["a"]) for _ in range(3))
    expiring = _submit(client, keys["a"], ttl_s=5)
    c = client.post(f"/internal/jobs/{taken}/claim", json={"worker_id": "w2"}, headers=WORKER)
    assert c.status_code == 200
    clock.advance(6)  # `expiring` waited past its ttl
    ids = [fresh, taken, "job_nothere", expiring, late]
    r = client.post(CLAIMS_PATH, json={"worker_id": "w1", "job_ids": ids}, headers=WORKER)
    assert r.status_code == 200, r.text
    claims = r.json()["claims"]
    assert [c["job_id"] for c in claims] == ids
    assert [c["claimed"] for c in claims] == [True, False, False, False, True]
    assert claims[0]["attempt"] == claims[4]["attempt"] == 1
    assert claims[0]["input"]["prompt"] == "x" and claims[0]["deployment"] == "demo"
    assert claims[0]["execution_timeout_s"] > 0
    # each job as its own claim would have left it (`taken`: still w2's first attempt)
    status = {j: _job(client, keys["a"], j)["status"] for j in (fresh, late, taken)}
    assert status == {fresh: "running", late: "running", taken: "running"}
    assert _job(client, keys["a"], taken)["attempt"] == 1
    gone = _job(client, keys["a"], expiring)
    assert (gone["status"], gone["status_reason"]) == ("expired", "ttl_passed")
    for jid in (fresh, late):
        events = redis_client.xrange(job_events_key(jid))
        assert [e[b"type"] for _, e in events].count(b"running") == 1
    # asked again (its answer was lost), the same worker gets the same attempts, announced once
    again = client.post(CLAIMS_PATH, json={"worker_id": "w1", "job_ids": ids}, headers=WORKER)
    assert [c["claimed"] for c in again.json()["claims"]] == [True, False, False, False, True]
    assert [c.get("attempt") for c in again.json()["claims"]][::4] == [1, 1]
    events = redis_client.xrange(job_events_key(fresh))
    assert [e[b"type"] for _, e in events].count(b"running") == 1


def test_a_report_of_several_jobs_is_fenced_per_job(
    client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"])
    one, two = _submit(client, keys["a"]), _submit(client, keys["a"])
    r = client.post(CLAIMS_PATH, json={"worker_id": "w1", "job_ids": [one, two]}, headers=WORKER)
    assert all(c["claimed"] for c in r.json()["claims"])
    done = {"status": "succeeded", "output": {"text": "a", "finish_reason": "stop"}}
    reports = [
        {"job_id": one, "attempt": 1, "prompt_tokens": 2, "generated_tokens": 1, **done},
        {"job_id": two, "attempt": 0, **done},  # a stale attempt: fenced off
    ]
    r = client.post(REPORTS_PATH, json={"worker_id": "w1", "reports": reports}, headers=WORKER)
    assert r.status_code == 200, r.text
    assert r.json()["reports"] == [{"job_id": one, "ok": True}, {"job_id": two, "ok": False}]
    first = _job(client, keys["a"], one)
    assert (first["status"], first["output"]["text"], first["usage"]["prompt_tokens"]) == (
        "succeeded",
        "a",
        2,
    )
    assert _job(client, keys["a"], two)["status"] == "running"
    # the same reports again: the first job's end is not rewritten, the second still fenced
    r = client.post(REPORTS_PATH, json={"worker_id": "w1", "reports": reports}, headers=WORKER)
    assert [x["ok"] for x in r.json()["reports"]] == [False, False]


def test_a_bad_report_refuses_the_request_and_writes_nothing(
    client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"])
    one, two = _submit(client, keys["a"]), _submit(client, keys["a"])
    client.post(CLAIMS_PATH, json={"worker_id": "w1", "job_ids": [one, two]}, headers=WORKER)
    reports = [
        {"job_id": one, "attempt": 1, "status": "succeeded", "output": {"text": "a"}},
        {"job_id": two, "attempt": 1, "status": "running"},  # not a terminal status
    ]
    r = client.post(REPORTS_PATH, json={"worker_id": "w1", "reports": reports}, headers=WORKER)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "terminal" in r.json()["detail"]
    assert [_job(client, keys["a"], j)["status"] for j in (one, two)] == ["running", "running"]


def test_batch_requests_are_bounded_and_need_the_worker_token(client: TestClient) -> None:
    ids = [f"job_{i}" for i in range(MAX_JOBS_PER_REQUEST + 1)]
    body = {"worker_id": "w1", "job_ids": ids}
    assert client.post(CLAIMS_PATH, json=body, headers=WORKER).status_code == 422
    empty = client.post(CLAIMS_PATH, json={"worker_id": "w1", "job_ids": []}, headers=WORKER)
    assert empty.status_code == 422
    assert client.post(CLAIMS_PATH, json={"worker_id": "w1", "job_ids": ["j"]}).status_code == 401
    reports = {"worker_id": "w1", "reports": [{"job_id": "j", "attempt": 1, "status": "failed"}]}
    assert client.post(REPORTS_PATH, json=reports).status_code == 401
    unknown = client.post(REPORTS_PATH, json=reports, headers=WORKER)
    assert unknown.status_code == 200 and unknown.json()["reports"] == [
        {"job_id": "j", "ok": False}
    ]


def test_each_traced_report_of_several_joins_its_own_trace(
    client: TestClient, keys: dict[str, str], spans: Any
) -> None:
    from opentelemetry.trace import SpanKind

    from common import tracing

    deploy(client, keys["a"])
    one, two = _submit(client, keys["a"]), _submit(client, keys["a"])
    client.post(CLAIMS_PATH, json={"worker_id": "w1", "job_ids": [one, two]}, headers=WORKER)
    trace_ids = {one: "1" * 32, two: "2" * 32}
    reports = [
        {
            "job_id": jid,
            "attempt": 1,
            "status": "succeeded",
            "output": {"text": "a"},
            "traceparent": f"00-{trace_ids[jid]}-{'3' * 16}-01",
        }
        for jid in (one, two)
    ]
    r = client.post(REPORTS_PATH, json={"worker_id": "w1", "reports": reports}, headers=WORKER)
    assert [x["ok"] for x in r.json()["reports"]] == [True, True]
    served = [s for s in spans.get_finished_spans() if s.name == f"POST {REPORTS_PATH}"]
    assert len(served) == 2
    for s in served:
        jid = s.attributes[tracing.JOB_ID]
        assert s.kind is SpanKind.SERVER and s.context.trace_id == int(trace_ids[jid], 16)
        assert s.parent is not None and s.parent.span_id == int("3" * 16, 16)

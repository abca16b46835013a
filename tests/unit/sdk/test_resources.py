"""The resource calls: jobs (list, refresh, wait, cancel, pages), deployments (and waiting for a
version to be ready), billing, workers and the webhook secret, against the requests and answers
the API documents."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sdk import APIError, Deployment, DeploymentNotReady, JobFailed, ModelError, PlatformError
from sdk._flows import PAGE_SIZE
from tests.unit.sdk.mock_platform import FakeTime, Server, answer, job
from tests.unit.sdk.twin import MakeClient


def test_jobs_list_follows_cursors_up_to_the_limit(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        answer(200, {"data": [job("job_1"), job("job_2")], "next_cursor": "c2"}),
        answer(200, {"data": [job("job_3"), job("job_4")], "next_cursor": "c3"}),
    )
    jobs = make_client(server, fake_time).jobs.list(deployment="demo", status="failed", limit=3)
    assert [j.id for j in jobs] == ["job_1", "job_2", "job_3"]
    first, second = (dict(r.url.params) for r in server.requests)
    assert first == {"deployment": "demo", "status": "failed", "limit": "3"}
    assert second == {"deployment": "demo", "status": "failed", "limit": "1", "cursor": "c2"}


def test_deployment_resource_calls(fake_time: FakeTime, make_client: MakeClient) -> None:
    dep = {"name": "demo", "model": "s3://m/d/", "max_workers": 1, "version": 2, "id": "dep_1"}
    dep["workers"] = {"idle": 1, "busy": 2}
    dep |= {"engine": "auto", "engine_resolved": "vllm", "engine_reason": "auto: vLLM serves it"}
    server = Server(
        answer(201, dep),
        answer(200, dep),
        answer(200, dep),
        answer(200, {"data": [dep], "next_cursor": None}),
        httpx.Response(204),
    )
    client = make_client(server, fake_time)
    created = client.deployments.create({"name": "demo"}, model="s3://m/d/")
    updated = client.deployments.update("demo", {"model": "s3://m/d/", "max_workers": 2})
    fetched = client.deployments.get("demo")
    listed = client.deployments.list()
    assert client.deployments.delete("demo") is None

    assert server.paths() == [
        "POST /v1/deployments",
        "PUT /v1/deployments/demo",
        "GET /v1/deployments/demo",
        "GET /v1/deployments",
        "DELETE /v1/deployments/demo",
    ]
    assert server.body(0) == {"name": "demo", "model": "s3://m/d/"}
    assert server.body(1) == {"name": "demo", "model": "s3://m/d/", "max_workers": 2}
    assert isinstance(created, Deployment) and created.version == 2
    assert fetched.workers == {"idle": 1, "busy": 2}
    # the engine asked for is the spec's; the one chosen, and why, the platform's
    assert fetched.spec == {
        "name": "demo",
        "model": "s3://m/d/",
        "max_workers": 1,
        "engine": "auto",
    }
    assert (fetched.engine_resolved, fetched.engine_reason) == ("vllm", "auto: vLLM serves it")
    assert [d.name for d in listed] == ["demo"] and updated.id == "dep_1"
    with pytest.raises(ValueError, match="does not match"):
        client.deployments.update("demo", {"name": "other"})


def test_billing_workers_webhooks_and_job_resources(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    record = {"id": 1, "phase": "busy", "seconds": "1.250", "amount": "0.000125"}
    server = Server(
        answer(200, {"data": [record], "next_cursor": None}),
        answer(200, {"data": [{"id": "wrk_1", "state": "idle"}]}),
        answer(200, {"secret": "whsec_abc"}),
        answer(200, job(status="canceled")),
        answer(502, {"title": "Bad Gateway"}),
    )
    client = make_client(server, fake_time)
    assert client.billing.records(deployment="demo", phase="busy", limit=10) == [record]
    assert client.workers.list(deployment="demo") == [{"id": "wrk_1", "state": "idle"}]
    assert client.webhooks.secret() == "whsec_abc"
    assert client.jobs.cancel("job_1").status == "canceled"
    # a rotation that may have happened is never sent twice
    with pytest.raises(APIError):
        client.webhooks.rotate_secret()
    assert dict(server.requests[0].url.params) == {
        "deployment": "demo",
        "phase": "busy",
        "limit": "10",
    }
    assert server.paths()[1:] == [
        "GET /v1/workers",
        "GET /v1/webhooks/secret",
        "POST /v1/jobs/job_1/cancel",
        "POST /v1/webhooks/secret/rotate",
    ]


def test_billing_check_and_the_webhook_secret(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(200, {"ok": True, "issues": []}),
        answer(200, {"secret": "whsec_new"}),
        answer(200, {"nope": 1}),
    )
    client = make_client(server, fake_time)
    assert client.billing.check() == {"ok": True, "issues": []}
    assert client.webhooks.rotate_secret() == "whsec_new"
    with pytest.raises(PlatformError, match="no secret"):
        client.webhooks.secret()
    assert server.paths() == [
        "GET /v1/billing/check",
        "POST /v1/webhooks/secret/rotate",
        "GET /v1/webhooks/secret",
    ]


def test_job_refresh_wait_and_cancel(fake_time: FakeTime, make_client: MakeClient) -> None:
    failed = job(status="failed", error={"type": "worker_lost", "message": "no heartbeat"})
    server = Server(
        answer(202, job(status="queued")),
        answer(200, job(status="running")),
        answer(200, failed),
        answer(200, job("job_1", "canceled")),
    )
    client = make_client(server, fake_time)
    submitted = client.submit("demo", "Hi")
    assert submitted.refresh().status == "running"
    with pytest.raises(JobFailed) as caught:
        submitted.wait(timeout=30)
    assert not isinstance(caught.value, ModelError)
    assert caught.value.error_type == "worker_lost"
    assert submitted.status == "failed" and submitted.error == failed["error"]
    assert submitted.cancel().status == "canceled"
    assert "Hi" not in repr(submitted)


def test_job_wait_reports_every_state(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(200, job(status="starting", status_reason="no_capacity")),
        answer(200, job(status="running")),
        answer(200, job()),
    )
    client = make_client(server, fake_time)
    first = client.jobs.get("job_1")
    seen: list[str] = []
    first.wait(timeout=30, on_update=lambda j: seen.append(j.status))
    assert seen == ["starting", "running", "succeeded"]


def test_list_pages_never_ask_for_more_than_the_endpoints_allow(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    page = [job(f"job_{i}") for i in range(PAGE_SIZE)]
    server = Server(
        answer(200, {"data": page, "next_cursor": "c2"}),
        answer(200, {"data": page[:50], "next_cursor": "c3"}),
    )
    jobs = make_client(server, fake_time).jobs.list(limit=150)
    assert len(jobs) == 150
    assert [r.url.params["limit"] for r in server.requests] == [str(PAGE_SIZE), "50"]


def worker(state: str, version: int = 2, worker_id: str = "wrk_1", **more: Any) -> dict[str, Any]:
    return {
        "id": worker_id,
        "deployment": "demo",
        "deployment_version": version,
        "state": state,
        **more,
    }


def test_wait_ready_follows_the_new_version_until_idle(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        answer(200, {"data": [worker("idle", version=1, worker_id="wrk_old")]}),
        answer(200, {"data": [worker("booting"), worker("idle", version=1, worker_id="wrk_old")]}),
        answer(200, {"data": [worker("loading")]}),
        answer(200, {"data": [worker("idle")]}),
    )
    seen: list[list[str]] = []
    ready = make_client(server, fake_time).deployments.wait_ready(
        "demo", version=2, timeout=60, on_update=lambda ws: seen.append([w["state"] for w in ws])
    )
    assert ready["id"] == "wrk_1" and ready["state"] == "idle"
    assert seen == [[], ["booting"], ["loading"], ["idle"]]
    assert set(server.paths()) == {"GET /v1/workers"}


def test_wait_ready_reads_the_current_version_and_reports_a_new_failure(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    old_failure = worker("failed", worker_id="wrk_0", reason="earlier")
    server = Server(
        answer(200, {"name": "demo", "version": 2}),
        answer(200, {"data": [old_failure, worker("loading")]}),
        answer(200, {"data": [old_failure, worker("failed", reason="ObjectNotFound: s3://m/x")]}),
    )
    with pytest.raises(DeploymentNotReady) as e:
        make_client(server, fake_time).deployments.wait_ready("demo")
    assert e.value.version == 2 and not e.value.timed_out
    assert "wrk_1 failed: ObjectNotFound" in str(e.value)


def test_wait_ready_times_out(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(*[answer(200, {"data": [worker("booting")]})] * 40)
    with pytest.raises(DeploymentNotReady) as e:
        make_client(server, fake_time).deployments.wait_ready("demo", version=2, timeout=3)
    assert e.value.timed_out and "booting" in e.value.reason

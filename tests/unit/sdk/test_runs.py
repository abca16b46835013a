"""Sync runs: a 202 polled until its job ends, the run timeout, and the error each way a job can
end badly raises."""

from __future__ import annotations

import pytest

from sdk import JobFailed, JobTimeout, ModelError, ServerError
from sdk._base import poll_interval_s
from tests.unit.sdk.mock_platform import FakeTime, Server, answer, job, problem
from tests.unit.sdk.twin import MakeClient, Twin


def test_a_202_is_polled_until_the_job_ends(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(202, job(status="queued"), **{"X-Job-Id": "job_1"}),
        answer(200, job(status="starting", status_reason="no_capacity")),
        answer(200, job(status="running")),
        answer(200, job()),
    )
    assert make_client(server, fake_time).run("demo", {"prompt": "Hi"}) == "Hello there"
    assert server.paths() == ["POST /v1/deployments/demo/run"] + ["GET /v1/jobs/job_1"] * 3
    assert fake_time.sleeps == [poll_interval_s(0), poll_interval_s(1), poll_interval_s(2)]


def test_the_job_id_comes_from_the_header_when_the_body_has_none(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    body = job(status="running")
    del body["id"]
    server = Server(answer(202, body, **{"X-Job-Id": "job_7"}), answer(200, job("job_7")))
    assert make_client(server, fake_time).run("demo", "Hi") == "Hello there"
    assert server.requests[1].url.path == "/v1/jobs/job_7"


def test_a_run_that_outlives_its_timeout_raises_job_timeout(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    running = answer(200, job(status="running"))
    server = Server(answer(202, job(status="running")), *[running] * 50)
    with pytest.raises(JobTimeout) as caught:
        make_client(server, fake_time).run("demo", "Hi", timeout=3.0)
    assert caught.value.job_id == "job_1"
    assert caught.value.timeout_s == 3.0
    assert fake_time.now == pytest.approx(3.0)
    assert server.body(0)["wait_s"] == 3.0  # never asks the server to hold it longer


@pytest.mark.parametrize(
    ("status", "error_type", "error_class"),
    [
        ("failed", "model_error", ModelError),
        ("failed", "invalid_input", ModelError),
        ("failed", "worker_lost", JobFailed),
        ("timed_out", "execution_timeout", JobFailed),
        ("canceled", None, JobFailed),
        ("expired", None, JobFailed),
    ],
)
def test_a_job_that_ends_badly_raises(
    status: str,
    error_type: str | None,
    error_class: type[JobFailed],
    fake_time: FakeTime,
    make_client: MakeClient,
) -> None:
    error = {"type": error_type, "message": "boom"} if error_type else None
    server = Server(answer(200, job(status=status, error=error)))
    with pytest.raises(JobFailed) as caught:
        make_client(server, fake_time).run("demo", "Hi")
    assert type(caught.value) is error_class
    assert caught.value.job_id == "job_1"
    assert caught.value.status == status
    assert caught.value.job.status == status


def test_wait_false_returns_the_job_unpolled(
    fake_time: FakeTime, make_client: MakeClient, twin: Twin
) -> None:
    server = Server(answer(202, job(status="queued")))
    result = make_client(server, fake_time).run("demo", "Hi", wait=False)
    assert isinstance(result, twin.Job)
    assert (result.id, result.status) == ("job_1", "queued")
    assert len(server.requests) == 1


def test_a_failing_poll_still_names_its_job(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(answer(202, job(status="running")), problem(500, "Internal Server Error"))
    client = make_client(server, fake_time, max_retries=0)
    with pytest.raises(ServerError) as caught:
        client.run("demo", "Hi")
    assert caught.value.job_id == "job_1"

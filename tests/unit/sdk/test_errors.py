"""problem+json answers mapped onto the SDK's error classes, with their fields, validation errors
and the job id an error is about."""

from __future__ import annotations

import httpx
import pytest

from sdk import (
    APIError,
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PlatformError,
    RateLimitError,
    ServerError,
)
from tests.unit.sdk.mock_platform import FakeTime, Server, problem
from tests.unit.sdk.twin import MakeClient


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, InvalidRequestError),
        (401, AuthenticationError),
        (403, AuthenticationError),
        (404, NotFoundError),
        (409, ConflictError),
        (413, InvalidRequestError),
        (422, InvalidRequestError),
        (429, RateLimitError),
        (500, ServerError),
        (418, APIError),
    ],
)
def test_problem_json_maps_to_the_error_class(
    status: int, error_class: type[APIError], fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(problem(status, "Nope", "deployment 'x' does not exist"))
    client = make_client(server, fake_time, max_retries=0)
    with pytest.raises(error_class) as caught:
        client.deployments.get("x")
    error = caught.value
    assert type(error) is error_class
    assert error.status == status
    assert error.title == "Nope"
    assert error.detail == "deployment 'x' does not exist"
    assert error.type == f"https://platform.dev/problems/{status}"
    assert error.problem["status"] == status
    assert "deployment 'x' does not exist" in str(error)


def test_validation_errors_and_the_job_id_header(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    errors = [{"field": "input.max_tokens", "message": "must be <= 4096"}]
    response = problem(422, "Unprocessable Entity", "invalid input", errors=errors)
    response.headers["X-Job-Id"] = "job_9"
    client = make_client(Server(response), fake_time)
    with pytest.raises(InvalidRequestError) as caught:
        client.run("demo", {"prompt": "Hi", "max_tokens": 10**6})
    assert caught.value.errors == errors
    assert caught.value.job_id == "job_9"


def test_an_error_that_is_not_json_keeps_its_text(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    html = httpx.Response(502, text="<html>bad gateway</html>")
    client = make_client(Server(html, html, html, html), fake_time, max_unavailable_s=0)
    with pytest.raises(ServerError) as caught:
        client.jobs.get("job_1")
    assert caught.value.status == 502
    assert caught.value.title == "Bad Gateway"
    assert "bad gateway" in caught.value.detail


def test_errors_about_a_job_carry_its_id(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        problem(404, "Not Found", "job 'job_9' does not exist"),
        httpx.ConnectError("refused"),
        httpx.ConnectError("refused"),
    )
    client = make_client(server, fake_time, max_retries=1, max_unavailable_s=0)
    with pytest.raises(NotFoundError) as missing:
        client.jobs.get("job_9")
    assert missing.value.job_id == "job_9"
    with pytest.raises(PlatformError) as unreachable:
        client.jobs.cancel("job_9")
    assert unreachable.value.job_id == "job_9"

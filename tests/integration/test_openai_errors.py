"""Every error on the OpenAI routes answers OpenAI's error object with OpenAI's status, type,
code and parameter name, over real HTTP, so that the official `openai` client raises its own
exception classes; the platform's routes keep problem+json."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.integration.api_helpers import SPEC, h, served

MESSAGES: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Small limits, so that the guards, the cap on jobs at once and the sync wait are reached."""
    return settings.model_copy(
        update={"max_request_bytes": 20_000, "default_max_in_flight": 1, "sync_wait_max_s": 0.3}
    )


@pytest.fixture
def http(settings: Settings, redis_client: Any) -> Iterator[httpx.Client]:
    with (
        served(create_app(settings)) as address,
        httpx.Client(base_url=f"http://{address}", timeout=30) as client,
    ):
        yield client


def oai(http: httpx.Client, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{str(http.base_url).rstrip('/')}/v1", api_key=key, max_retries=0, timeout=30
    )


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI error object of `r`, checked for its status and shape."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def problem_of(r: httpx.Response, status: int, slug: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith("/" + slug)


def deploy(http: httpx.Client, key: str) -> None:
    assert http.post("/v1/deployments", json=SPEC, headers=h(key)).status_code == 201


def test_a_missing_or_wrong_key(http: httpx.Client, keys: dict[str, str]) -> None:
    for headers in ({}, h("pk_nope_0123456789"), {"Authorization": "Basic eDp5"}):
        error = error_of(http.get("/v1/models", headers=headers), 401)
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error", "invalid_api_key", None,
        )  # fmt: skip
    with pytest.raises(openai.AuthenticationError) as info:
        oai(http, "pk_nope_0123456789").models.list()
    assert info.value.code == "invalid_api_key"


def test_an_unknown_model(http: httpx.Client, keys: dict[str, str]) -> None:
    r = http.post("/v1/chat/completions", json={"model": "nope", "messages": MESSAGES},
                  headers=h(keys["a"]))  # fmt: skip
    error = error_of(r, 404)
    assert (error["type"], error["code"]) == ("invalid_request_error", "model_not_found")
    assert "nope" in error["message"]
    with pytest.raises(openai.NotFoundError) as info:
        oai(http, keys["a"]).completions.create(model="nope", prompt="hi")
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        ("/v1/chat/completions", {"model": "demo"}, "messages", "missing_required_parameter"),
        ("/v1/chat/completions", {"model": "demo", "messages": []}, "messages", "empty_array"),
        ("/v1/chat/completions", {"model": "demo", "messages": [{"role": "wizard"}]},
         "messages[0].role", "invalid_value"),
        ("/v1/chat/completions",
         {"model": "demo", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content", "invalid_value"),
        ("/v1/chat/completions", {"model": "demo", "messages": MESSAGES, "max_tokens": 0},
         "max_tokens", "integer_below_min_value"),
        ("/v1/chat/completions", {"model": "demo", "messages": MESSAGES, "temperature": 2.5},
         "temperature", "decimal_above_max_value"),
        ("/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": "many"},
         "max_tokens", "invalid_type"),
        ("/v1/completions", {"model": "demo", "prompt": []}, "prompt", "empty_array"),
    ],
)  # fmt: skip
def test_invalid_input_names_the_parameter(
    http: httpx.Client, keys: dict[str, str], path: str, body: dict[str, Any], param: str,
    code: str,
) -> None:  # fmt: skip
    deploy(http, keys["a"])
    error = error_of(http.post(path, json=body, headers=h(keys["a"])), 400)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)


def test_invalid_input_is_the_client_s_bad_request(
    http: httpx.Client, keys: dict[str, str]
) -> None:
    deploy(http, keys["a"])
    with pytest.raises(openai.BadRequestError) as info:
        oai(http, keys["a"]).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=0
        )
    assert info.value.param == "max_tokens" and info.value.code == "integer_below_min_value"
    json_type = {**h(keys["a"]), "Content-Type": "application/json"}
    r = http.post("/v1/chat/completions", content=b"{not json", headers=json_type)
    error = error_of(r, 400)
    assert error["message"].startswith("We could not parse the JSON body")
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, None)


def test_a_key_without_the_scope(http: httpx.Client, keys: dict[str, str]) -> None:
    deploy(http, keys["a"])
    with pytest.raises(openai.PermissionDeniedError) as info:
        oai(http, keys["ro"]).chat.completions.create(model="demo", messages=MESSAGES)
    assert info.value.code == "insufficient_permissions"
    error = error_of(
        http.post("/v1/completions", json={"model": "demo", "prompt": "hi"}, headers=h(keys["ro"])),
        403,
    )
    assert error["type"] == "permission_error"


def test_over_a_limit_then_still_running(http: httpx.Client, keys: dict[str, str]) -> None:
    deploy(http, keys["a"])
    # no worker: the call waits the whole sync wait, and its job runs on (pollable)
    r = http.post("/v1/completions", json={"model": "demo", "prompt": "hi"}, headers=h(keys["a"]))
    error = error_of(r, 504)
    assert (error["type"], error["code"]) == ("server_error", "timeout")
    assert r.headers["X-Job-Id"] in error["message"]
    # that job is the one the tenant may have at once
    r = http.post("/v1/completions", json={"model": "demo", "prompt": "hi"}, headers=h(keys["a"]))
    error = error_of(r, 429)
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", "rate_limit_exceeded")
    assert r.headers["Retry-After"] == "1"
    with pytest.raises(openai.RateLimitError) as info:
        oai(http, keys["a"]).chat.completions.create(model="demo", messages=MESSAGES)
    assert info.value.code == "rate_limit_exceeded"
    # the platform's own route: problem+json for the same condition
    r = http.post("/v1/deployments/demo/jobs", json={"input": {"prompt": "hi"}},
                  headers=h(keys["a"]))  # fmt: skip
    problem_of(r, 429, "rate-limited")


def test_guards_before_the_route(http: httpx.Client, keys: dict[str, str]) -> None:
    big: dict[str, Any] = {"model": "demo", "messages": [{"role": "user", "content": "x" * 30_000}]}
    error = error_of(http.post("/v1/chat/completions", json=big, headers=h(keys["a"])), 413)
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
    with pytest.raises(openai.APIStatusError) as info:
        oai(http, keys["a"]).chat.completions.create(model="demo", messages=big["messages"])
    assert info.value.status_code == 413 and info.value.code == "request_too_large"
    problem_of(http.post("/v1/deployments", json={**SPEC, "x": "x" * 30_000},
                         headers=h(keys["a"])), 413, "too-large")  # fmt: skip

    nested = '{"model": "demo", "messages": [], "metadata": ' + "[" * 100 + "]" * 100 + "}"
    r = http.post("/v1/chat/completions", content=nested, headers=h(keys["a"]))
    assert error_of(r, 400)["code"] == "invalid_value"
    problem_of(http.post("/v1/deployments", content=nested, headers=h(keys["a"])), 422,
               "invalid-request")  # fmt: skip

    many = {**h(keys["a"]), **{f"x-filler-{i}": "1" for i in range(120)}}
    error = error_of(http.get("/v1/models", headers=many), 431)
    assert error["code"] == "request_header_fields_too_large"
    problem_of(http.get("/v1/jobs", headers=many), 431, "headers-too-large")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/moderations"),
        ("POST", "/v1/images/generations"),
        ("POST", "/v1/audio/transcriptions"),
        ("GET", "/v1/assistants"),
        ("POST", "/v1/threads/thread_1/runs"),
        ("GET", "/v1/fine_tuning/jobs"),
        ("GET", "/v1/vector_stores"),
        ("POST", "/v1/uploads"),
    ],
)
def test_openai_routes_not_served(
    http: httpx.Client, keys: dict[str, str], method: str, path: str
) -> None:
    error = error_of(http.request(method, path, json={}, headers=h(keys["a"])), 404)
    assert (error["type"], error["code"]) == ("invalid_request_error", "unknown_url")
    assert f"{method} {path}" in error["message"]


def test_the_client_on_routes_not_served_and_wrong_methods(
    http: httpx.Client, keys: dict[str, str]
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        oai(http, keys["a"]).embeddings.create(model="demo", input="hi")
    assert info.value.code == "unknown_url"
    r = http.get("/v1/chat/completions", headers=h(keys["a"]))
    error = error_of(r, 405)
    assert error["code"] == "method_not_allowed" and r.headers["Allow"] == "POST"
    assert error_of(http.delete("/v1/models", headers=h(keys["a"])), 405)["type"] == (
        "invalid_request_error"
    )
    # the platform's own routes, and /v1 paths that are nobody's, keep problem+json
    problem_of(http.get("/v1/batches/b_nope", headers=h(keys["a"])), 404, "not-found")
    problem_of(http.get("/v1/nothing-here", headers=h(keys["a"])), 404, "not-found")
    problem_of(http.delete("/v1/jobs", headers=h(keys["a"])), 405, "method-not-allowed")

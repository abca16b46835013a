"""The requests the clients build (path, headers, body, idempotency key, timeout) and where their
URL and key come from (arguments, environment, config file, defaults)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from sdk import PlatformError
from sdk._config import Credentials, write_config
from tests.unit.sdk.mock_platform import BASE, KEY, FakeTime, Server, answer, job
from tests.unit.sdk.twin import MakeClient, Twin


def test_run_builds_the_documented_request_and_returns_the_text(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(answer(200, job(), **{"X-Job-Id": "job_1"}))
    with make_client(server, fake_time) as client:
        text = client.run("demo", {"prompt": "Hi", "max_tokens": 16})

    assert text == "Hello there"
    [request] = server.requests
    assert request.method == "POST"
    assert str(request.url) == f"{BASE}/v1/deployments/demo/run"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    uuid.UUID(request.headers["idempotency-key"])  # a fresh uuid4 per call
    body = server.body(0)
    assert body["input"] == {"prompt": "Hi", "max_tokens": 16}
    assert body["stream"] is False
    # The server holds a sync run for less than the 30 s HTTP timeout, then answers 202.
    assert 0 < body["wait_s"] < 30
    assert request.extensions["timeout"]["read"] == 30.0


def test_a_bare_string_input_is_the_prompt(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(answer(200, job()))
    make_client(server, fake_time).run("demo", "Hi")
    assert server.body(0)["input"] == {"prompt": "Hi"}


def test_names_are_percent_encoded_into_one_path_segment(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(answer(200, job()))
    make_client(server, fake_time).jobs.get("job/../x")
    assert server.requests[0].url.raw_path == b"/v1/jobs/job%2F..%2Fx"


def test_config_precedence_args_env_file_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, twin: Twin
) -> None:
    def seen(*args: str) -> tuple[str, str | None]:
        server = Server(answer(200, {"data": []}))
        twin.client(*args, transport=httpx.MockTransport(server)).workers.list()
        request = server.requests[0]
        url = str(request.url.copy_with(query=None))
        return url.removesuffix("/v1/workers"), request.headers.get("authorization")

    assert seen() == ("http://127.0.0.1:8000", None)

    config = tmp_path / "config.json"
    write_config(config, "http://from-file:1", "key-file")
    assert config.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("PLATFORM_CONFIG", str(config))
    assert seen() == ("http://from-file:1", "Bearer key-file")

    monkeypatch.setenv("PLATFORM_URL", "http://from-env:2/")
    assert seen() == ("http://from-env:2", "Bearer key-file")
    monkeypatch.setenv("PLATFORM_API_KEY", "key-env")
    assert seen() == ("http://from-env:2", "Bearer key-env")

    assert seen("http://explicit:3", "key-arg") == ("http://explicit:3", "Bearer key-arg")


def test_a_broken_config_file_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, twin: Twin
) -> None:
    config = tmp_path / "config.json"
    config.write_text("{not json")
    monkeypatch.setenv("PLATFORM_CONFIG", str(config))
    with pytest.raises(PlatformError, match="not valid JSON"):
        twin.client()


def test_a_url_without_a_scheme_is_refused(monkeypatch: pytest.MonkeyPatch, twin: Twin) -> None:
    with pytest.raises(PlatformError, match=r"'localhost:8000' \(from the base_url argument\)"):
        twin.client("localhost:8000")
    monkeypatch.setenv("PLATFORM_URL", "ftp://x")
    with pytest.raises(PlatformError, match="PLATFORM_URL"):
        twin.client()


def test_max_retries_below_zero_is_refused(twin: Twin) -> None:
    with pytest.raises(ValueError, match="max_retries"):
        twin.client(BASE, KEY, max_retries=-1)
    with pytest.raises(ValueError, match="max_unavailable_s"):
        twin.client(BASE, KEY, max_unavailable_s=-1)


def test_credentials_repr_hides_the_key() -> None:
    assert KEY not in repr(Credentials(BASE, KEY))

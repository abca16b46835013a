"""Bounded request heads: too many header fields, or too many bytes of them, get 431 before the
app runs, in process (the ASGI guard) and over real HTTP (the server stops reading a head
past the byte limit). The settings reach the embedded platform (its API processes read them)
and the Helm chart."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from control_plane.api import server
from control_plane.api.app import create_app
from control_plane.embedded.processes import free_port
from control_plane.settings import Settings
from tests.infra.chart import RELEASE, find, objects
from tests.integration.api_helpers import h

MB = 1_000_000


def test_a_megabyte_header_is_431(client: TestClient, keys: dict[str, str]) -> None:
    r = client.get("/v1/jobs", headers={**h(keys["a"]), "X-Big": "a" * MB})
    assert r.status_code == 431, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["limit_bytes"] == Settings().max_header_bytes
    assert "the limit is 65536" in r.json()["detail"]


def test_two_thousand_headers_are_431(client: TestClient, keys: dict[str, str]) -> None:
    many = [(f"x-h{i}", "1") for i in range(2_000)]
    r = client.get("/v1/jobs", headers=[*h(keys["a"]).items(), *many])
    assert r.status_code == 431, r.text
    assert "header fields; the limit is 100" in r.json()["detail"]
    assert int(r.json()["detail"].split()[0]) > 2_000


def test_ordinary_headers_pass(client: TestClient, keys: dict[str, str]) -> None:
    headers = {**h(keys["a"]), **{f"x-h{i}": "v" * 500 for i in range(90)}}
    assert client.get("/v1/jobs", headers=headers).status_code == 200


@pytest.fixture
def served(settings: Settings, redis_client: object) -> Iterator[int]:
    """The API as `python -m control_plane.api` serves it (api/server.py), on a free port."""
    port = free_port()
    config = server.config(
        create_app(settings), settings.model_copy(update={"api_port": port}), log_level="error"
    )
    serving = uvicorn.Server(config)
    thread = threading.Thread(target=serving.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not serving.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield port
    serving.should_exit = True
    thread.join(10)


def _raw(port: int, head: bytes) -> bytes:
    """Send `head` on a fresh connection; what the server answered before closing it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        # answered and closed while the head was still being sent
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(head)
        out = b""
        try:
            while chunk := s.recv(65_536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


def test_the_server_stops_reading_a_huge_head(served: int, keys: dict[str, str]) -> None:
    # 50 MB of one header field: the server answers 431 after the limit, not after 50 MB
    head = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (50 * MB) + b"\r\n\r\n"
    answer = _raw(served, head)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b'"limit_bytes": 65536' in answer


def test_over_http_fields_and_bytes_are_431_and_ordinary_calls_pass(
    served: int, keys: dict[str, str]
) -> None:
    url = f"http://127.0.0.1:{served}/v1/jobs"
    with httpx.Client(timeout=10) as c:
        assert c.get(url, headers=h(keys["a"])).status_code == 200
        many = [*h(keys["a"]).items(), *[(f"x-h{i}", "1") for i in range(2_000)]]
        assert c.get(url, headers=many).status_code == 431
        big = c.get(url, headers={**h(keys["a"]), "X-Big": "a" * MB})
        assert big.status_code == 431
        # a large body after a small head is no head: it reaches the route (and its limit)
        body = b"{" + b" " * (2 * MB) + b"}"
        r = c.post(f"http://127.0.0.1:{served}/v1/keys", content=body, headers=h(keys["a"]))
        assert r.status_code == 413, r.text


def test_the_helm_chart_sets_the_limits() -> None:
    data = find(objects(), "ConfigMap", f"{RELEASE}-env")["data"]
    assert data["PLATFORM_MAX_HEADER_BYTES"] == str(Settings().max_header_bytes)
    assert data["PLATFORM_MAX_HEADER_COUNT"] == str(Settings().max_header_count)

"""An unhandled exception answers problem+json 500 over real HTTP (uvicorn) and leaves the
keep-alive connection usable: the client's next request on it succeeds."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.integration.api_helpers import served


@pytest.fixture
def server_url(settings: Settings, redis_client: Any) -> Iterator[str]:
    app = create_app(settings)

    @app.get("/v1/boom")
    def boom() -> None:
        raise RuntimeError("a bug, not the client's fault")

    with served(app) as address:
        yield address


def exchange(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":", 1)[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_500_keeps_the_connection_usable(server_url: str) -> None:
    host, port = server_url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        first = exchange(sock, "/v1/boom")
        assert first.startswith(b"HTTP/1.1 500")
        assert b"application/problem+json" in first and b"/problems/internal" in first, first
        assert b"a bug" not in first  # the exception text stays in the server's log
        # the same socket: the server did not drop the connection after the 500
        second = exchange(sock, "/healthz")
        assert second.startswith(b"HTTP/1.1 200")

"""JSON POSTs to one HTTP/1.1 origin over kept-alive connections, for the worker's reports.

The worker's claim and its report are two requests on every job's warm path. httpx spent about
0.3 ms of Python per request on them (measured: 455-485 µs against a trivial local server, where
the standard library takes 135 µs), on two cores the worker shares with the control plane. A
request here is one write (headers and body together) and `http.client`'s response parser.

Thread-safe: a request takes an idle connection (or opens one) and gives it back once its
answer is read whole. Nothing is retried here but a kept-alive connection the server closed
while idle, which no request reached (see `post`); the caller retries the rest.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# What a request that never got its answer raises: the connection failed, timed out, or the
# server's answer was not HTTP.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)


# How a connection the server closed shows: the write or the read is reset, or the read ends
# before a status line (http.client.RemoteDisconnected is a ConnectionResetError).
_CLOSED_UNDER_US = (ConnectionResetError, BrokenPipeError)


class StatusError(Exception):
    """An answer whose status the caller did not expect."""

    def __init__(self, method: str, path: str, status: int) -> None:
        super().__init__(f"{method} {path} answered {status}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Answer:
    status_code: int
    content: bytes
    path: str

    def json(self) -> Any:
        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if not 200 <= self.status_code < 300:
            raise StatusError("POST", self.path, self.status_code)


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def stale(self) -> bool:
        """True when the server closed it (or sent something unasked) while it was idle: an
        idle connection has nothing to read."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


class JsonHttp:
    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = url.hostname
        self._tls = url.scheme == "https"
        self._port = url.port or (443 if self._tls else 80)
        self._prefix = url.path.rstrip("/")
        self._timeout_s = timeout_s
        self._ssl = ssl.create_default_context() if self._tls else None
        default_port = self._port == (443 if self._tls else 80)
        authority = self._host if default_port else f"{self._host}:{self._port}"
        if ":" in self._host:  # an IPv6 literal is bracketed in Host
            authority = f"[{self._host}]" if default_port else f"[{self._host}]:{self._port}"
        fixed = {"Host": authority, "Content-Type": "application/json", **headers}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Answer:
        """POST `body` as JSON; the answer, whatever its status. Raises one of
        TRANSPORT_ERRORS when no answer came."""
        raw = self._request(path, json.dumps(body, separators=(",", ":")).encode(), headers)
        conn, reused = self._take()
        try:
            return self._exchange(conn, path, raw)
        except _CLOSED_UNDER_US:
            conn.close()
            if not reused:
                raise
        except TRANSPORT_ERRORS:
            conn.close()
            raise
        # The server can close a kept-alive connection in the instant between the staleness
        # check and the write (uvicorn closes idle ones after 5 s): the request is then gone
        # with no answer, so it goes again at once, on a new connection, rather than after the
        # caller's backoff. Had it reached a route, a repeat is harmless: the worker's claims
        # and reports are idempotent, which the caller's own retries rely on too.
        conn = self._open()
        try:
            return self._exchange(conn, path, raw)
        except TRANSPORT_ERRORS:
            conn.close()
            raise

    def _request(self, path: str, body: bytes, headers: dict[str, str] | None) -> bytes:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"POST {self._prefix}{path} HTTP/1.1\r\n{self._fixed}{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    def _take(self) -> tuple[_Connection, bool]:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open(), False
            if not conn.stale():
                return conn, True
            conn.close()

    def _open(self) -> _Connection:
        sock = socket.create_connection((self._host, self._port), timeout=self._timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._host)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)

    def _exchange(self, conn: _Connection, path: str, raw: bytes) -> Answer:
        conn.sock.sendall(raw)
        resp = http.client.HTTPResponse(conn.sock, method="POST")
        try:
            resp.begin()
            content = resp.read()
        finally:
            resp.close()
        if resp.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return Answer(resp.status, content, path)

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

"""The worker's JSON-over-HTTP client against a real HTTP/1.1 server on loopback."""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from worker.runtime import json_http
from worker.runtime.json_http import TRANSPORT_ERRORS, JsonHttp, StatusError


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.silent = threading.Event()  # set: /slow never answers

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        with self.lock:
            self.connections += 1
        return conn, addr

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless told otherwise
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.requests.append(
                {"path": self.path, "body": body, "headers": dict(self.headers)}
            )
        route = self.path.removeprefix("/base")
        if route == "/slow":
            self.server.silent.wait(10)
            return
        status = int(body.get("status", 200))
        answer = json.dumps({"echo": body, "path": self.path}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        if route == "/close":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer)
        if route == "/hang-up":  # answered as kept alive, then closed (an idle timeout)
            self.wfile.flush()
            self.close_connection = True


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.silent.set()
    srv.shutdown()
    srv.server_close()
    thread.join(5)


@pytest.fixture
def client(server: _Server) -> Iterator[JsonHttp]:
    c = JsonHttp(server.url + "/base/", {"Authorization": "Bearer t0k"}, timeout_s=5)
    yield c
    c.close()


def test_a_post_carries_its_json_and_headers_and_returns_the_answer(
    client: JsonHttp, server: _Server
) -> None:
    answer = client.post("/x", {"n": 1, "text": "héllo"}, {"traceparent": "00-ab-cd-01"})
    assert answer.status_code == 200
    assert answer.json() == {"echo": {"n": 1, "text": "héllo"}, "path": "/base/x"}
    seen = server.requests[0]["headers"]
    assert seen["Authorization"] == "Bearer t0k"
    assert seen["traceparent"] == "00-ab-cd-01"
    assert seen["Content-Type"] == "application/json"
    assert seen["Host"] == server.url.removeprefix("http://")


def test_any_status_is_an_answer_and_raise_for_status_names_it(client: JsonHttp) -> None:
    answer = client.post("/x", {"status": 409})
    assert answer.status_code == 409
    with pytest.raises(StatusError, match="409") as caught:
        answer.raise_for_status()
    assert caught.value.status == 409
    client.post("/x", {"status": 204}).raise_for_status()


def test_requests_share_one_kept_alive_connection(client: JsonHttp, server: _Server) -> None:
    for i in range(5):
        assert client.post("/x", {"i": i}).json()["echo"] == {"i": i}
    assert server.connections == 1


def test_a_connection_the_server_closes_is_not_used_again(
    client: JsonHttp, server: _Server
) -> None:
    assert client.post("/close", {}).status_code == 200
    assert client.post("/x", {}).status_code == 200
    assert server.connections == 2


def test_a_connection_closed_while_idle_is_replaced_before_the_write(
    client: JsonHttp, server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.post("/hang-up", {})
    # the server closes it just after its answer: wait until that reached this side
    deadline = time.monotonic() + 5
    while not all(c.stale() for c in client._idle) and time.monotonic() < deadline:
        time.sleep(0.01)
    writes = 0
    exchange = JsonHttp._exchange

    def counted(self: JsonHttp, *args: Any) -> json_http.Answer:
        nonlocal writes
        writes += 1
        return exchange(self, *args)

    monkeypatch.setattr(JsonHttp, "_exchange", counted)
    assert client.post("/x", {"after": True}).json()["echo"] == {"after": True}
    assert writes == 1  # not written to the closed one first
    assert server.connections == 2
    assert [r["path"] for r in server.requests] == ["/base/hang-up", "/base/x"]


def test_a_close_that_races_the_write_sends_the_request_again_on_a_new_connection(
    client: JsonHttp, server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.post("/hang-up", {})
    # the server's close lands after the idleness check: the check sees nothing
    monkeypatch.setattr(json_http._Connection, "stale", lambda self: False)
    assert client.post("/x", {"raced": True}).json()["echo"] == {"raced": True}
    assert server.connections == 2


def test_a_fresh_connection_that_fails_raises_a_transport_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as spare:
        port = spare.getsockname()[1]  # nothing listens there once this closes
    c = JsonHttp(f"http://127.0.0.1:{port}", {}, timeout_s=2)
    with pytest.raises(TRANSPORT_ERRORS):
        c.post("/x", {})
    c.close()


def test_no_answer_times_out_once_and_is_not_sent_again(server: _Server) -> None:
    c = JsonHttp(server.url, {}, timeout_s=0.3)
    c.post("/x", {})  # a kept-alive connection: a timeout there is not a close to retry
    with pytest.raises(TimeoutError):
        c.post("/slow", {})
    assert [r["path"] for r in server.requests] == ["/x", "/slow"]
    c.close()


def test_concurrent_posts_each_get_their_own_answer(client: JsonHttp, server: _Server) -> None:
    wrong: list[int] = []

    def post(i: int) -> None:
        for j in range(20):
            if client.post("/x", {"i": i, "j": j}).json()["echo"] != {"i": i, "j": j}:
                wrong.append(i)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert wrong == []
    assert len(server.requests) == 160
    assert server.connections <= 8  # connections are given back and taken again


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_verifies_the_server_and_carries_the_post(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    url = f"https://127.0.0.1:{server.server_address[1]}"

    untrusted = JsonHttp(url, {}, timeout_s=5)
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusted.post("/x", {})
    untrusted.close()

    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the default context's trust store
    trusted = JsonHttp(url, {}, timeout_s=5)
    assert trusted.post("/x", {"over": "tls"}).json()["echo"] == {"over": "tls"}
    assert trusted.post("/x", {"again": 1}).status_code == 200
    trusted.close()
    # one kept-alive connection (the refused handshake failed inside the server's accept)
    assert server.connections == 1

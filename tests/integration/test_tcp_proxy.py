"""The fault suite's TCP proxy (tests/faults/tcp_proxy.py) against a real loopback echo server:
it forwards bytes unchanged, and each fault does what its name says (and heals)."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faults.tcp_proxy import FaultProxy
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(60)


class EchoServer:
    """Echoes every byte back on each connection; counts what it received."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.sock.getsockname()
        self.received = 0
        self.resets = 0  # connections that ended with an RST from the proxy
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _echo(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                self.received += len(data)
                conn.sendall(data)
        except ConnectionResetError:
            self.resets += 1
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close() alone does not)
        self.sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._accepter.join(5)
        for t in self._threads:
            t.join(5)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(echo.address) as p:
        yield p


def connect(proxy: FaultProxy, timeout_s: float = 5.0) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=timeout_s)


def round_trip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_forwards_bytes_unchanged_both_ways(proxy: FaultProxy, echo: EchoServer) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: many chunks
    with connect(proxy) as a, connect(proxy) as b:
        assert round_trip(a, payload) == payload
        assert round_trip(b, b"second connection") == b"second connection"
    assert echo.received == len(payload) + len(b"second connection")
    assert proxy.stats.accepted == 2


def test_a_half_close_reaches_the_upstream(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        s.sendall(b"last words")
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100) == b"last words"  # the echo server answered, then saw EOF
        assert s.recv(100) == b""  # and closed its side: passed back as EOF


def test_delay_adds_latency_each_way_and_heal_removes_it(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        proxy.delay(0.2)
        t0 = time.monotonic()
        assert round_trip(s, b"ping") == b"ping"
        slow_s = time.monotonic() - t0
        proxy.heal()
        t0 = time.monotonic()
        assert round_trip(s, b"ping") == b"ping"
        fast_s = time.monotonic() - t0
    assert 0.4 <= slow_s < 1.5  # 0.2 s there, 0.2 s back
    assert fast_s < 0.1


def test_delay_is_latency_not_a_rate_limit(proxy: FaultProxy) -> None:
    """Chunks that arrive together leave together: 20 of them do not take 20 × the delay."""
    with connect(proxy) as s:
        proxy.delay(0.2)
        t0 = time.monotonic()
        for _ in range(20):
            s.sendall(b"x" * 1000)
            time.sleep(0.005)
        got = 0
        while got < 20_000:
            got += len(s.recv(65536))
        elapsed_s = time.monotonic() - t0
    assert 0.4 <= elapsed_s < 1.5


def test_drop_blackholes_open_and_new_connections(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy, timeout_s=0.3) as before:
        assert round_trip(before, b"hello") == b"hello"
        received = echo.received
        proxy.drop()
        before.sendall(b"into the void")
        with pytest.raises(TimeoutError):
            before.recv(100)  # nothing comes back, nothing is closed
        with connect(proxy, timeout_s=0.3) as during:  # accepted: a black hole, not a refusal
            during.sendall(b"also lost")
            with pytest.raises(TimeoutError):
                during.recv(100)
        assert echo.received == received  # the upstream heard nothing
        assert proxy.stats.dropped_bytes >= len(b"into the void") + len(b"also lost")
        proxy.heal()
        # NOTE: a connection that lived through a drop stays a black hole (its stream lost
        # bytes); only new connections are forwarded again
        before.sendall(b"still lost")
        with pytest.raises(TimeoutError):
            before.recv(100)
    with connect(proxy) as after:
        assert round_trip(after, b"back") == b"back"


def test_reset_sends_rst_to_both_ends(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy) as s:
        assert round_trip(s, b"hello") == b"hello"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):
            s.recv(100)
    wait_for(lambda: echo.resets == 1, 5, every_s=0.01)  # the upstream's side was reset too
    assert proxy.stats.reset == 1
    with connect(proxy) as s:  # no refusal asked: new connections go through at once
        assert round_trip(s, b"again") == b"again"


def test_reset_can_refuse_new_connections_for_a_while(proxy: FaultProxy) -> None:
    proxy.reset(refuse_s=0.5)
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    wait_for(lambda: _connects(proxy), 3, every_s=0.01)
    with connect(proxy) as s:
        assert round_trip(s, b"open again") == b"open again"


def test_a_refusing_port_stays_held(proxy: FaultProxy) -> None:
    """While it refuses, nothing else can take the port (as a client's ephemeral source port
    could, were it let go), so the proxy always gets it back."""
    proxy.reset(refuse_s=30)
    with socket.socket() as other, pytest.raises(OSError) as taken:
        other.bind(proxy.address)
    assert taken.value.errno == errno.EADDRINUSE
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    proxy.heal()
    with connect(proxy) as s:
        assert round_trip(s, b"back") == b"back"


def test_heal_ends_a_refusal_early(proxy: FaultProxy) -> None:
    proxy.reset(refuse_s=30)
    proxy.heal()
    with connect(proxy) as s:
        assert round_trip(s, b"healed") == b"healed"


def test_an_upstream_set_later_serves_the_waiting_connection(echo: EchoServer) -> None:
    with FaultProxy() as proxy, connect(proxy) as s:
        s.sendall(b"early")
        proxy.retarget(echo.address)
        assert s.recv(100) == b"early"


def test_an_upstream_that_is_down_resets_the_client() -> None:
    with socket.create_server(("127.0.0.1", 0)) as spare:
        down = spare.getsockname()  # a port nothing listens on once this closes
    # The kernel finishes the handshake before the proxy accepts, so the reset can reach
    # the client while connect() still reads its outcome (on a loaded machine), at the
    # send or at the read: each of them is the reset this asserts.
    with (
        FaultProxy(down) as proxy,
        pytest.raises((ConnectionResetError, BrokenPipeError)),
        connect(proxy) as s,
    ):
        s.sendall(b"anyone?")
        if not s.recv(100):
            raise ConnectionResetError("closed")


def test_close_leaves_no_thread_port_or_connection(echo: EchoServer) -> None:
    proxy = FaultProxy(echo.address)
    s = connect(proxy)
    assert round_trip(s, b"x") == b"x"
    proxy.close()
    assert [t for t in threading.enumerate() if t.name == "fault-proxy"] == []
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        s.sendall(b"y")
        if not s.recv(10):
            raise ConnectionResetError("closed")
    s.close()
    proxy.close()  # twice: a no-op


def _connects(proxy: FaultProxy) -> bool:
    try:
        connect(proxy, timeout_s=1).close()
    except ConnectionRefusedError:
        return False
    return True

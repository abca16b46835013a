"""A TCP fault proxy for the fault suite: it listens on loopback, forwards every connection to
one upstream (Redis, the S3 server) and breaks the path on demand, while it runs.

    with FaultProxy(("127.0.0.1", 6379)) as proxy:     # or FaultProxy() and .retarget() later
        url = f"redis://127.0.0.1:{proxy.port}/0"      # what the clients are given
        proxy.delay(0.25)      # every chunk, each direction, arrives 0.25 s later
        proxy.drop()           # black hole: bytes are read and vanish, peers wait for timeouts
        proxy.reset(refuse_s=1.0)  # RST on every connection; new ones refused for 1 s
        proxy.heal()           # new connections forwarded normally again

What each fault models:

- `delay`: a slow path. Each chunk is stamped when it arrives and sent at stamp + delay, so
  latency grows but throughput does not collapse (a load of many parts is slowed by the
  latency of its requests, not by chunk count × delay).
- `drop`: the path loses every packet (a partition, a lost NAT/conntrack entry). Nothing is
  answered, nothing is closed: a client learns only from its own timeouts. NOTE: a connection
  that was open during a drop stays a black hole for life, even after `heal()`: its stream has
  lost bytes and can never be consistent again, as when a peer's connection state is gone.
  Only connections opened after `heal()` are forwarded.
- `reset`: the path is cut: both ends of every connection get an RST (SO_LINGER 0), as when a
  peer or a middlebox restarts; with `refuse_s`, the port is closed for that long, so new
  connections are refused (ECONNREFUSED), as while a server restarts. The port stays bound
  (not listening) meanwhile: were it let go, a client's outgoing connection could take it as
  its ephemeral source port, and the proxy could not listen on it again.

Everything runs on one asyncio loop in one daemon thread of the test process; `close()` (the
context manager's exit) aborts every connection, closes the port and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# Bytes read per chunk from either side.
CHUNK_BYTES = 64 << 10
# A connection accepted before the upstream is known (`retarget`) waits this long for it.
UPSTREAM_WAIT_S = 60.0
# Connect timeout towards the upstream.
CONNECT_TIMEOUT_S = 5.0


@dataclass(slots=True)
class ProxyStats:
    """What the proxy has seen since it started (read from any thread; counts only)."""

    accepted: int = 0  # connections accepted from clients
    forwarded_bytes: int = 0  # bytes sent on, both directions
    dropped_bytes: int = 0  # bytes read and thrown away by a black hole
    reset: int = 0  # connections cut by `reset()`


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter, blackholed: bool) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        # NOTE: once True, never False again (see the module doc)
        self.blackholed = blackholed
        self.tasks: list[asyncio.Task[None]] = []

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]


class FaultProxy:
    """See the module doc. Thread-safe: the fault methods may be called from any thread."""

    def __init__(self, upstream: tuple[str, int] | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.stats = ProxyStats()
        self._upstream = upstream
        self._delay_s = 0.0
        self._dropping = False
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy")
        self._server: asyncio.Server | None = None
        # While the port refuses: a socket bound to it, not listening (see the module doc)
        self._held: socket.socket | None = None
        self._upstream_known = asyncio.Event()
        self._reopen: asyncio.TimerHandle | None = None
        self._closed = False
        self._thread.start()
        try:
            self.port: int = self._call(self._listen(0))
            if upstream is not None:
                self._call(self._set_upstream(upstream))
        except BaseException:
            self._stop_loop()
            raise

    # --- lifetime ------------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Abort every connection, close the port, stop the loop and join its thread."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            self._call(self._shutdown())
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # --- faults --------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def retarget(self, upstream: tuple[str, int]) -> None:
        """Forward new connections to `upstream` (connections waiting for one go now)."""
        self._call(self._set_upstream(upstream))

    def delay(self, seconds: float) -> None:
        """Every chunk that arrives from now on, in either direction, is sent `seconds` later."""
        self._call(self._set(delay_s=max(0.0, seconds)))

    def drop(self) -> None:
        """Black hole: every open connection, and each new one until `heal()`, reads and
        discards what it receives and forwards nothing."""
        self._call(self._set(dropping=True))

    def reset(self, refuse_s: float = 0.0) -> int:
        """Cut every connection with an RST to both its ends; with `refuse_s`, refuse new
        connections for that long (the port is closed). Returns how many were cut."""
        return self._call(self._reset(refuse_s))

    def heal(self) -> None:
        """No delay, no black hole for new connections, the port open again."""
        self._call(self._heal())

    @property
    def connections(self) -> int:
        """Connections open now."""
        return self._call(self._count())

    # --- the loop's side -----------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _listen(self, port: int) -> int:
        held, self._held = self._held, None
        if held is not None:  # listen on the socket that kept the port
            self._server = await asyncio.start_server(self._accept, sock=held, limit=CHUNK_BYTES)
        else:
            # SO_REUSEPORT so that `_close_port` can bind its holder beside this socket
            self._server = await asyncio.start_server(
                self._accept,
                self.host,
                port,
                reuse_address=True,
                reuse_port=True,
                limit=CHUNK_BYTES,
            )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def _close_port(self, hold: bool = False) -> None:
        """Stop listening; with `hold`, keep the port bound (a socket that does not listen:
        connections are refused) until `_listen` takes it back."""
        if self._server is None:
            return
        if hold and self._held is None:
            held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            held.bind((self.host, self.port))  # bound before the listener goes: no gap
            held.setblocking(False)
            self._held = held
        self._server.close()
        await self._server.wait_closed()
        self._server = None

    async def _set_upstream(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._upstream_known.set()

    async def _set(self, delay_s: float | None = None, dropping: bool | None = None) -> None:
        if delay_s is not None:
            self._delay_s = delay_s
        if dropping:
            self._dropping = True
            for link in self._links:
                link.blackholed = True

    async def _heal(self) -> None:
        self._delay_s = 0.0
        self._dropping = False
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if self._server is None and not self._closed:
            await self._listen(self.port)

    async def _reset(self, refuse_s: float) -> int:
        if refuse_s > 0:
            await self._close_port(hold=True)
            if self._reopen is not None:
                self._reopen.cancel()
            self._reopen = self._loop.call_later(
                refuse_s, lambda: self._loop.create_task(self._reopen_port())
            )
        links = list(self._links)
        for link in links:
            self._abort(link)
        self.stats.reset += len(links)
        return len(links)

    async def _reopen_port(self) -> None:
        self._reopen = None
        if self._server is None and not self._closed:
            await self._listen(self.port)

    async def _count(self) -> int:
        return len(self._links)

    async def _shutdown(self) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
        await self._close_port()
        if self._held is not None:
            self._held.close()
            self._held = None
        links = list(self._links)
        for link in links:
            self._abort(link)
        tasks = [t for link in links for t in link.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    def _abort(self, link: _Link) -> None:
        """RST both ends now (SO_LINGER 0: close sends RST, not FIN) and end the pumps."""
        self._links.discard(link)
        for w in link.writers():
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()
        for t in link.tasks:
            if t is not asyncio.current_task():
                t.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        link = _Link(writer, blackholed=self._dropping)
        self._links.add(link)
        link.tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await self._serve(link, reader)
        except (asyncio.CancelledError, OSError):
            pass
        finally:
            if link in self._links:
                self._abort(link)

    async def _serve(self, link: _Link, client: asyncio.StreamReader) -> None:
        if link.blackholed:
            await self._swallow(link, client)  # a drop: the upstream never hears of it
            return
        if not self._upstream_known.is_set():
            await asyncio.wait_for(self._upstream_known.wait(), UPSTREAM_WAIT_S)
        assert self._upstream is not None
        try:
            upstream, link.upstream = await asyncio.wait_for(
                asyncio.open_connection(*self._upstream, limit=CHUNK_BYTES), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            return  # the upstream is down: the client is reset, as by the server itself
        if link not in self._links:  # reset while connecting
            self._abort(link)
            return
        ups = asyncio.create_task(self._pump(link, client, link.upstream))
        downs = asyncio.create_task(self._pump(link, upstream, link.client))
        link.tasks += [ups, downs]
        await asyncio.gather(ups, downs)
        for w in link.writers():
            w.close()
        self._links.discard(link)

    async def _swallow(self, link: _Link, src: asyncio.StreamReader) -> None:
        while data := await src.read(CHUNK_BYTES):
            self.stats.dropped_bytes += len(data)
        link.client.close()

    async def _pump(
        self, link: _Link, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        """Copy `src` to `dst` until EOF (passed on as a half-close), each chunk held until
        its due time; a black hole swallows instead. An error on either side aborts the
        link: the other side gets an RST, as it would from a cut path."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(link, queue, dst))
        link.tasks.append(sender)  # so that close() waits for it too
        try:
            while data := await src.read(CHUNK_BYTES):
                if link.blackholed:
                    self.stats.dropped_bytes += len(data)
                else:
                    queue.put_nowait((time.monotonic() + self._delay_s, data))
            queue.put_nowait((time.monotonic() + self._delay_s, b""))  # EOF, in order
            await sender
        except (OSError, asyncio.IncompleteReadError):
            self._abort(link)
            return
        finally:
            sender.cancel()
        if link.blackholed:
            # One end left a black hole: the other never hears of it, and would keep its
            # connection (an idle Redis client's, for the rest of the run) open otherwise.
            self._abort(link)

    async def _send(
        self, link: _Link, queue: asyncio.Queue[tuple[float, bytes]], dst: asyncio.StreamWriter
    ) -> None:
        while True:
            due, data = await queue.get()
            wait_s = due - time.monotonic()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if link.blackholed:
                if not data:
                    return  # EOF into a black hole: it never arrives either
                self.stats.dropped_bytes += len(data)
                continue
            if not data:
                if dst.can_write_eof():
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                return
            dst.write(data)
            self.stats.forwarded_bytes += len(data)
            try:
                await dst.drain()
            except OSError:
                self._abort(link)
                return

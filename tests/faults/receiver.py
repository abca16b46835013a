"""A webhook receiver on loopback that logs every delivery attempt it gets and answers 200,
or, given a plan, misbehaves as the plan says for each attempt: a 500, a connection reset, an
answer slower than the platform waits, a redirect.

The fault checker reads its log (invariant I3); nothing here judges what arrived.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True, slots=True)
class Delivery:
    """One HTTP request the receiver got (a delivery attempt of one webhook message)."""

    # the raw request body, exactly as signed
    body: bytes
    # request headers, names lower-cased (webhook-id, webhook-timestamp, webhook-signature)
    headers: dict[str, str]
    # time.time() when it arrived
    received_at: float
    # what the sender got: an HTTP status, or 0 for none (reset, or answered after it gave up)
    status: int = 200


# What the receiver does with one attempt: answer 200 ("ok"), 500, reset the connection, answer
# 200 after SLOW_S (past the platform's webhook timeout in the fault platform), or redirect.
BEHAVIOURS = ("ok", "500", "reset", "slow", "redirect")
SLOW_S = 3.0
# (webhook-id, which attempt of it this is, from 1) -> one of BEHAVIOURS
Plan = Callable[[str, int], str]


class WebhookReceiver:
    """`with WebhookReceiver() as rx:` serves `rx.url`; `rx.log()` is every attempt so far.

    Example:
        with WebhookReceiver() as rx:
            client.submit("demo", {"prompt": "Hi"}, webhook=rx.url)
            ...
            assert rx.log()
    """

    def __init__(self, plan: Plan | None = None, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._log: list[Delivery] = []
        self._seen: Counter[str] = Counter()  # attempts so far per webhook-id
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                arrived = time.time()
                with receiver._lock:
                    msg_id = headers.get("webhook-id", "")
                    receiver._seen[msg_id] += 1
                    nth = receiver._seen[msg_id]
                what = plan(msg_id, nth) if plan is not None else "ok"
                status = {"ok": 200, "500": 500, "redirect": 302}.get(what, 0)
                with receiver._lock:
                    receiver._log.append(Delivery(body, headers, arrived, status))
                if what == "reset":
                    # RST instead of an answer: linger 0, then the server closes the socket
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.close_connection = True
                    return
                if what == "slow":
                    time.sleep(SLOW_S)
                self.send_response(status or 200)
                if what == "redirect":
                    self.send_header("location", receiver.url + "/moved")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass  # NOTE: bodies carry outputs; never logged

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def log(self) -> list[Delivery]:
        with self._lock:
            return list(self._log)

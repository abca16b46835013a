"""A webhook receiver on loopback that logs every delivery attempt it gets and answers 200.

The fault checker reads its log (invariant I3); nothing here judges what arrived.
"""

from __future__ import annotations

import threading
import time
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


class WebhookReceiver:
    """`with WebhookReceiver() as rx:` serves `rx.url`; `rx.log()` is every attempt so far.

    Example:
        with WebhookReceiver() as rx:
            client.submit("demo", {"prompt": "Hi"}, webhook=rx.url)
            ...
            assert rx.log()
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log: list[Delivery] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._lock:
                    receiver._log.append(Delivery(body, headers, time.time()))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass  # NOTE: bodies carry outputs; never logged

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
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

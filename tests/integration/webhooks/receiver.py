"""A real HTTP webhook receiver on loopback, its answer chosen by the request path, recording
every request it gets (path, headers, raw body, time of arrival)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str  # request path at the receiver
    headers: dict[str, str]  # lower-cased header names
    body: bytes  # raw body (signatures cover these bytes)
    at: float  # monotonic time of arrival

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """HTTP receiver whose behaviour is chosen by the path:

    /ok/...         200
    /flaky/K/...    500 for the first K requests, then 200
    /fail/...       always 500
    /gone/...       410
    """

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    seen = sum(1 for r in receiver.received if r.path == self.path)
                    receiver.received.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.monotonic(),
                        )
                    )
                parts = self.path.strip("/").split("/")
                code = {"ok": 200, "fail": 500, "gone": 410}.get(parts[0], 200)
                if parts[0] == "flaky":
                    code = 500 if seen < int(parts[1]) else 200
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

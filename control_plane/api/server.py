"""The API's HTTP server: uvicorn, with the request head bounded.

uvicorn's httptools protocol buffers a header of any size (a 50 MB header field reaches the
app), and its h11 protocol answers a long head with a bare 400. `BoundedHttpTools` stops
reading a head once `PLATFORM_MAX_HEADER_BYTES` of it arrived without its end, answers 431
and closes the connection: a client cannot make the server hold more than that (plus one read
of at most 256 KiB) before the app's own guard (api/header_limit.py) sees the request.
"""

from __future__ import annotations

import json
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from control_plane.api.problems import PROBLEM_BASE
from control_plane.settings import Settings


class BoundedHttpTools(HttpToolsProtocol):
    """httptools with a bound on the bytes of one request head (`max_head_bytes`).

    The bytes received while a head is incomplete are counted after each read is parsed: a
    read that completes the head (and carries body bytes) never counts against it. NOTE: a
    pipelined read may count the end of the previous request's body too; the bound stays far
    above any real head, so only a head near it could be refused for that.
    """

    max_head_bytes = 65_536

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # a connection starts with a request's head
        self._head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.max_head_bytes:
            self._refuse()

    def _refuse(self) -> None:
        detail = f"the request head passed {self.max_head_bytes} bytes"
        body = json.dumps(
            {
                "type": PROBLEM_BASE + "headers-too-large",
                "title": "Request Header Fields Too Large",
                "status": 431,
                "detail": detail,
                "instance": "",
                "limit_bytes": self.max_head_bytes,
            }
        ).encode()
        head = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\n"
            "content-type: application/problem+json\r\n"
            f"content-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()


def bounded_protocol(max_head_bytes: int) -> type[BoundedHttpTools]:
    return type("BoundedHttpTools", (BoundedHttpTools,), {"max_head_bytes": max_head_bytes})


def config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """How the API is served (`python -m control_plane.api`, and the tests that serve it)."""
    return uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        http=bounded_protocol(settings.max_header_bytes),
        **options,
    )

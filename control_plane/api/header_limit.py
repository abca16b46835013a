"""Request head limits: the number of header fields and their bytes, checked before any route
(or body read) runs. Past either the answer is 431 problem+json (OpenAI's error object on
OpenAI's paths).

The server already stops reading a head past `max_header_bytes` (api/server.py); this guard
also holds where the app runs under another server, and counts fields, which no server here
bounds.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from control_plane.api import problems

# Per field, what it costs on the wire besides its name and value: ": " and CRLF.
FIELD_OVERHEAD_BYTES = 4


class HeaderLimit:
    """At most `max_count` header fields of at most `max_bytes` in all."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_count: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_count = max_count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            what = None
            if len(headers) > self.max_count:
                what = f"{len(headers)} header fields; the limit is {self.max_count}"
            else:
                size = sum(len(n) + len(v) for n, v in headers)
                size += FIELD_OVERHEAD_BYTES * len(headers)
                if size > self.max_bytes:
                    what = f"header fields of {size} bytes; the limit is {self.max_bytes}"
            if what is not None:
                response = problems.refusal(
                    scope.get("path", ""),
                    431,
                    "headers-too-large",
                    "Request Header Fields Too Large",
                    what,
                    code="request_header_fields_too_large",
                    limit_bytes=self.max_bytes,
                    limit_count=self.max_count,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

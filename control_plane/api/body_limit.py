"""Request body limits: the bytes actually received (not what `Content-Length` claims) and the
nesting depth of a JSON body.

A chunked request has no `Content-Length`; a lying client may send one too small. The body is
read here, up to the limit, before any route sees it: one byte over and the answer is 413
problem+json, nothing having been parsed or written. Bodies are small JSON documents (the
limit is ~1 MB; batch inputs are read from object storage, not uploaded), so holding one in
memory is the same cost the route's JSON parsing pays anyway.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api import problems

# No request of this API nests deeper than ~6 levels (a chat message's content parts); 64
# leaves room for users' metadata and stays far below what the JSON parser, pydantic and the
# serializers that echo it back can recurse through.
MAX_JSON_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(body: bytes) -> int:
    """Deepest nesting of arrays and objects in `body` (strings skipped); no parsing."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for b in brackets:
        depth += 1 if b in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


class BodyLimit:
    def __init__(self, app: ASGIApp, limit_bytes: int) -> None:
        self.app = app
        self.limit_bytes = limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit_bytes:
            await self._too_large(scope, receive, send, f"request body is {int(declared)} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit_bytes:
                await self._too_large(scope, receive, send, f"request body passed {size} bytes")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if b"json" in dict(scope["headers"]).get(b"content-type", b""):
            depth = json_depth(body)
            if depth > MAX_JSON_DEPTH:
                response = problems.problem(
                    422,
                    "invalid-request",
                    "Invalid Request",
                    f"JSON body nests {depth} levels deep; the limit is {MAX_JSON_DEPTH}",
                    scope.get("path", ""),
                    limit=MAX_JSON_DEPTH,
                )
                await response(scope, receive, send)
                return
        pending: list[Message] = [{"type": "http.request", "body": body}]

        async def replay() -> Message:
            # the body once, then the real channel (a streamed response waits for disconnect)
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, what: str) -> None:
        response = problems.problem(
            413,
            "too-large",
            "Payload Too Large",
            f"{what}; the limit is {self.limit_bytes}",
            scope.get("path", ""),
            limit_bytes=self.limit_bytes,
        )
        await response(scope, receive, send)

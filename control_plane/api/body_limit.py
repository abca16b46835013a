"""Request body limits: the bytes actually received (not what `Content-Length` claims) and the
nesting depth of a JSON body.

A chunked request has no `Content-Length`; a lying client may send one too small. The body is
read here, up to the limit, before any route sees it: one byte over and the answer is 413
problem+json (OpenAI's error object on OpenAI's paths), nothing having been parsed or written.
Bodies are small JSON documents (the limit is ~1 MB; batch inputs are read from object
storage, not uploaded), so holding one in memory is the same cost the route's JSON parsing
pays anyway.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api import problems

# No request of this API nests deeper than ~6 levels (a chat message's content parts); 64
# leaves room for users' metadata and stays far below what the JSON parser, pydantic and the
# serializers that echo it back can recurse through.
MAX_JSON_DEPTH = 64
# Every byte but a quote or a bracket.
_NOT_MARKS = bytes(b for b in range(256) if b not in b'"[]{}')
_QUOTE = ord('"')
_OPENING = frozenset(b"[{")


def json_depth(body: bytes) -> int:
    """Deepest nesting of arrays and objects in `body` (strings skipped); no parsing.

    Memory stays a few copies of the body however many strings it holds: no object per string
    (a regex `sub` removing the strings held ~200 bytes for each: 400 MB for a batch of a
    million small lines, and its backtracking 2 GB to skip one 21 MB string)."""
    # Escaped backslashes, then escaped quotes, gone: every quote left opens or closes a string.
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Only the quotes and brackets; a pair of quotes with nothing between them (a string with
    # no bracket in it) dropped, which changes no bracket's side of any quote.
    marks = plain.translate(None, _NOT_MARKS).replace(b'""', b"")
    depth = deepest = 0
    in_string = False
    for b in marks:
        if b == _QUOTE:
            in_string = not in_string
        elif not in_string:
            depth += 1 if b in _OPENING else -1
            deepest = max(deepest, depth)
    return deepest


class BodyLimit:
    """`limit_bytes` for every request; `routes` raises it for (method, path) pairs where larger
    bodies are legitimate (an inline batch). Requests under a `streamed` (method, path prefix)
    are passed through unread, after the declared length is checked: their route streams the
    body onwards and counts it against that limit itself (file uploads)."""

    def __init__(
        self,
        app: ASGIApp,
        limit_bytes: int,
        routes: dict[tuple[str, str], int] | None = None,
        streamed: dict[tuple[str, str], int] | None = None,
    ) -> None:
        self.app = app
        self.limit_bytes = limit_bytes
        self.routes = routes or {}
        self.streamed = streamed or {}

    def _streamed_limit(self, method: str, path: str) -> int | None:
        for (m, prefix), limit in self.streamed.items():
            if m == method and path.startswith(prefix):
                return limit
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        streamed = self._streamed_limit(scope["method"], scope["path"])
        limit = self.routes.get((scope["method"], scope["path"].rstrip("/")), self.limit_bytes)
        limit = streamed if streamed is not None else limit
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _too_large(scope, receive, send, f"request body is {int(declared)} bytes", limit)
            return
        if streamed is not None:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await _too_large(scope, receive, send, f"request body passed {size} bytes", limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = dict(scope["headers"]).get(b"content-type", b"")
        # FastAPI parses a body without a content type as JSON too
        if not content_type or b"json" in content_type:
            depth = json_depth(body)
            if depth > MAX_JSON_DEPTH:
                response = problems.refusal(
                    scope.get("path", ""),
                    422,  # 400 on OpenAI's paths, as OpenAI answers invalid input
                    "invalid-request",
                    "Invalid Request",
                    f"JSON body nests {depth} levels deep; the limit is {MAX_JSON_DEPTH}",
                    code="invalid_value",
                    limit=MAX_JSON_DEPTH,
                )
                await response(scope, receive, send)
                return
        pending: list[Message] = [{"type": "http.request", "body": body}]

        async def replay() -> Message:
            # the body once, then the real channel (a streamed response waits for disconnect)
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


async def _too_large(scope: Scope, receive: Receive, send: Send, what: str, limit: int) -> None:
    response = problems.refusal(
        scope.get("path", ""),
        413,
        "too-large",
        "Payload Too Large",
        f"{what}; the limit is {limit}",
        code="request_too_large",
        limit_bytes=limit,
    )
    await response(scope, receive, send)

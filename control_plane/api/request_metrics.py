"""Counts every HTTP request by method, route template and status (`platform_http_requests_total`).

Outside the catch-all and the body limit, so it sees the status the client got (their 413s
and 500s included). The route is the matched template
(`/v1/jobs/{job_id}`), never the raw path: the label stays bounded whatever clients send;
a path no route matched is `unmatched`.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.metrics import families

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"


class RequestMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if nothing was sent: what the server answers for an escaped error

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            method = scope.get("method", "")
            families.http_request(method if method in METHODS else "other", route_of(scope), status)


def route_of(scope: Scope) -> str:
    """The template of the route that handled the request (set on the scope by routing)."""
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED

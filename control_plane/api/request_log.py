"""The outermost middleware: a request id for every request, and one log line at its end.

The id is the caller's `X-Request-Id` when it is short and plain (a proxy's or a client's own
id, so both logs join), else a new one; it is echoed in the response's `X-Request-Id` and is in
every log line of the request (`common.logs.log_context`). A route adds the ids it finds with
`common.logs.bind` (the job it created), so the last line names them too:

    {"message": "POST /v1/deployments/{name}/runs 200", "request_id": "req_…",
     "job_id": "job_…", "deployment_id": "dep_…", "method": "POST",
     "route": "/v1/deployments/{name}/runs", "status_code": 200, "duration_s": 0.0123, …}

Only the route's template is logged (or the path when none matched), never a query string or
a body. Workers' calls (`/internal/…`) and health checks are logged at DEBUG: they are many.

The same end of the request is counted in `platform_http_requests_total` by method, route
template and status (`unmatched` when no route matched, so the label stays bounded whatever
clients send). Being outermost, both see the status the client got: the body limit's 413s and
the catch-all's 500s included.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common import logs
from control_plane.domain.ids import new_id
from control_plane.metrics import families

log = logging.getLogger(__name__)
HEADER = b"x-request-id"
# A caller's id is kept only if it is this plain: it goes into headers and log lines as is.
_SAFE_ID = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
# Path params that are ids the log fields name.
_PATH_IDS = ("job_id", "batch_id", "worker_id")
_QUIET_PREFIXES = ("/internal/", "/healthz")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The caller's `X-Request-Id` if short and safe, else a new `req_…` id."""
    for name, value in headers:
        if name == HEADER and _SAFE_ID.fullmatch(value):
            return value.decode()
    return new_id("req", datetime.now(UTC))


class RequestLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope["headers"])
        status_code = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
                message["headers"] = [*message.get("headers", ()), (HEADER, rid.encode())]
            await send(message)

        started = time.perf_counter()
        with logs.log_context(request_id=rid):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                self._log(scope, status_code, time.perf_counter() - started)

    @staticmethod
    def _log(scope: Scope, status_code: int, duration_s: float) -> None:
        method: str = scope["method"]
        template = route_of(scope)
        counted = method if method in METHODS else "other"
        # nothing sent (0): counted as what the server answers for an error that escaped
        families.http_request(counted, template, status_code or 500, duration_s)
        path: str = scope.get("path", "")
        level = logging.DEBUG if path.startswith(_QUIET_PREFIXES) else logging.INFO
        if not log.isEnabledFor(level):
            return
        route = template if template != UNMATCHED else path[:200]
        params = scope.get("path_params") or {}
        log.log(
            level,
            "%s %s %d",
            scope["method"],
            route,
            status_code,
            extra={
                "method": scope["method"],
                "route": route,
                "status_code": status_code,
                "duration_s": round(duration_s, 6),
                **{k: params[k] for k in _PATH_IDS if looks_like_id(params.get(k))},
            },
        )


def route_of(scope: Scope) -> str:
    """The template of the route that handled the request (set on the scope by routing)."""
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


def looks_like_id(value: object) -> bool:
    """A path parameter is anything a caller typed: logged as an id only if it could be one."""
    return isinstance(value, str) and _SAFE_ID.fullmatch(value.encode()) is not None

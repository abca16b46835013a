"""A server span per API request (OpenTelemetry), installed only when tracing is on.

The span continues the caller's trace when the request carries a W3C `traceparent` header (a
malformed one is ignored: the span starts a new trace). It is current while the route runs, so
the spans a route starts (`job.admit`) are its children and a job it creates stores its trace.

    POST /v1/deployments/{name}/run  [server]  http.request.method, http.route,
                                               http.response.status_code, platform.request.id

Health checks, /metrics and the console are not traced; neither are the workers' own calls
(`/internal/…`) unless they carry a `traceparent` (a worker's completion report does: it is
part of its job's trace). Only the route's template is recorded, never a query string or body.
The request's log lines carry the span's `trace_id` and `span_id` (common/logs.py).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common import logs, tracing
from control_plane.api.request_log import looks_like_id

_HEADER = b"traceparent"
_UNTRACED = ("/healthz", "/metrics", "/console")


class TraceRequests:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or path.startswith(_UNTRACED):
            await self.app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == _HEADER), None)
        if incoming is None and path.startswith("/internal/"):
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        status_code = 0

        async def send_status(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            await send(message)

        with tracing.span(
            method,
            parent=tracing.context_of(incoming),
            kind="server",
            attributes={
                "http.request.method": method,
                tracing.REQUEST_ID: logs.current_ids().get("request_id"),
            },
        ) as span:
            # the request's own log line is written after this span has ended (RequestLog is
            # outside): its trace and span ids stay in the request's log context
            logs.bind(**tracing.ids_of(span))
            try:
                await self.app(scope, receive, send_status)
            finally:
                if span is not None:
                    route = getattr(scope.get("route"), "path", None)
                    span.update_name(f"{method} {route}" if route else method)
                    job_id = (scope.get("path_params") or {}).get("job_id")
                    span.set_attributes(
                        {
                            "http.response.status_code": status_code,
                            **({"http.route": route} if route else {}),
                            **({tracing.JOB_ID: job_id} if looks_like_id(job_id) else {}),
                        }
                    )
                    if status_code >= 500 or status_code == 0:
                        tracing.failed(span, str(status_code) if status_code else "no_response")

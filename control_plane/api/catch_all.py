"""The last line of defence: an exception no handler took becomes a 500 problem+json here, and
is not re-raised.

Starlette's own server-error middleware answers the 500 and then re-raises, so the server
(uvicorn) drops the keep-alive connection and the client's next request on it fails too. This
middleware sits inside that one and ends the exception after answering. If the response had
already started (a stream cut by a bug), nothing can be sent: the error is logged and the
response ends.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api.problems import internal_error

log = logging.getLogger(__name__)


class CatchAll:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            path = scope.get("path", "")
            log.exception("unhandled error on %s", path)
            if started:
                return
            response = internal_error(path)
            await response(scope, receive, send)

"""Request dependencies of the API: its context, a session, the caller, the request's time.

The context itself (`AppContext`) is in `control_plane/context.py`.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from control_plane.context import AppContext
from control_plane.errors import Unauthorized
from control_plane.services.tenants import api_keys


# The trivial dependencies are `async def`: FastAPI runs a plain `def` one on a pool thread,
# a thread hop per request for a dictionary lookup.
async def ctx(request: Request) -> AppContext:
    context: AppContext = request.app.state.ctx
    return context


def db(context: Annotated[AppContext, Depends(ctx)]) -> Iterator[Session]:
    with context.sessions() as session:
        yield session


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header (the one parser of it)."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    return authorization[7:].strip()


async def request_time(context: Annotated[AppContext, Depends(ctx)]) -> datetime:
    """The time of this request, from the app's clock (tests inject one)."""
    return context.clock()


def principal(
    context: Annotated[AppContext, Depends(ctx)],
    session: Annotated[Session, Depends(db)],
    authorization: Annotated[str | None, Header()] = None,
) -> api_keys.Principal:
    return context.edge.view().principal(session, bearer_token(authorization))


async def worker_auth(
    context: Annotated[AppContext, Depends(ctx)],
    authorization: Annotated[str | None, Header()] = None,
) -> None:
    expected = context.settings.worker_token.get_secret_value()
    if not expected or not hmac.compare_digest(bearer_token(authorization), expected):
        raise Unauthorized("invalid worker token")


Ctx = Annotated[AppContext, Depends(ctx)]
Db = Annotated[Session, Depends(db)]
Principal = Annotated[api_keys.Principal, Depends(principal)]
Now = Annotated[datetime, Depends(request_time)]

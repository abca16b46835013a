"""Per-process resources of the API (built once in create_app) and request dependencies."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import redis
import redis.asyncio as aioredis
from celery import Celery
from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session, sessionmaker

from control_plane.errors import Unauthorized
from control_plane.services import auth
from control_plane.services.model_meta import ModelMetaCache
from control_plane.services.quotas import Quotas
from control_plane.settings import Settings


@dataclass(frozen=True, slots=True)
class AppContext:
    settings: Settings  # this process's settings
    sessions: sessionmaker[Session]  # SQL session factory
    redis: redis.Redis  # sync client (thread-pool routes, event publishing)
    aredis: aioredis.Redis  # async client (blocking stream reads in async routes)
    celery: Celery  # producer of worker wake-ups and background tasks
    model_meta: ModelMetaCache  # context length, tokenizer, chat template per deployment version
    quotas: Quotas  # per-tenant rate and in-flight limits


def now() -> datetime:
    return datetime.now(UTC)


def ctx(request: Request) -> AppContext:
    context: AppContext = request.app.state.ctx
    return context


def db(context: Annotated[AppContext, Depends(ctx)]) -> Iterator[Session]:
    with context.sessions() as session:
        yield session


def _bearer(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    return authorization[7:].strip()


def principal(
    session: Annotated[Session, Depends(db)],
    authorization: Annotated[str | None, Header()] = None,
) -> auth.Principal:
    return auth.authenticate(session, _bearer(authorization))


def worker_auth(
    context: Annotated[AppContext, Depends(ctx)],
    authorization: Annotated[str | None, Header()] = None,
) -> None:
    expected = context.settings.worker_token.get_secret_value()
    if not expected or not hmac.compare_digest(_bearer(authorization), expected):
        raise Unauthorized("invalid worker token")


Ctx = Annotated[AppContext, Depends(ctx)]
Db = Annotated[Session, Depends(db)]
Principal = Annotated[auth.Principal, Depends(principal)]

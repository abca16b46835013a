"""The FastAPI application: `create_app(settings)` wires resources, routes and error handling."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI

from common import tracing
from control_plane.api import openapi, problems
from control_plane.api.body_limit import BodyLimit
from control_plane.api.catch_all import CatchAll
from control_plane.api.header_limit import HeaderLimit
from control_plane.api.request_log import RequestLog
from control_plane.api.routes import (
    batches,
    billing,
    console,
    deployments,
    files,
    health,
    internal,
    jobs,
    keys,
    logs,
    metrics,
    openai,
    openai_completions,
    responses,
    webhooks,
)
from control_plane.api.trace_requests import TraceRequests
from control_plane.context import AppContext
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.clock import Clock, utc_now
from control_plane.services.jobs.dispatch import make_celery
from control_plane.services.models import chat_template
from control_plane.services.models.model_meta import ModelMetaCache
from control_plane.services.tenants.edge_cache import EdgeCache, install_invalidation
from control_plane.services.tenants.quotas import Quotas
from control_plane.settings import Settings


def create_app(settings: Settings, clock: Clock = utc_now) -> FastAPI:
    """The app; `clock` is the time every route uses (tests pass one they control)."""
    engine = make_engine(settings.database_url)
    sync_redis = redis.Redis.from_url(settings.redis_url)
    sessions = make_sessionmaker(engine)
    install_invalidation(sessions, sync_redis)
    ctx = AppContext(
        settings=settings,
        sessions=sessions,
        redis=sync_redis,
        aredis=aioredis.Redis.from_url(settings.redis_url),
        celery=make_celery(settings),
        edge=EdgeCache(sync_redis),
        model_meta=ModelMetaCache(settings, sessions),
        quotas=Quotas(sync_redis, settings.quota_fail_open),
        clock=clock,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await ctx.aredis.aclose()
        ctx.redis.close()
        engine.dispose()
        chat_template.shutdown()  # its render process, if one was started

    app = FastAPI(
        title="Serverless LLM platform",
        version="0.1.0",
        lifespan=lifespan,
        description="Deploy safetensors models from object storage and call them; pay per second.",
    )
    app.state.ctx = ctx
    problems.install(app)
    openapi.install(app)

    app.add_middleware(CatchAll)
    app.add_middleware(
        BodyLimit,
        limit_bytes=settings.max_request_bytes,
        # an inline batch (`inputs` / `input_jsonl`) may be as large as a batch input file
        routes={("POST", "/v1/batches"): settings.batch_max_input_bytes},
        # uploads stream to object storage as they arrive; the route counts their bytes
        streamed={("PUT", "/v1/files/"): settings.upload_max_bytes},
    )
    if tracing.enabled():  # off: not even a pass-through layer on the hot path
        app.add_middleware(TraceRequests)  # inside RequestLog: spans carry the request id
    # before anything reads a header or the body; inside RequestLog, so a 431 is logged
    app.add_middleware(
        HeaderLimit, max_bytes=settings.max_header_bytes, max_count=settings.max_header_count
    )
    app.add_middleware(RequestLog)  # added last, so outermost: every answer has its request id,
    # and its log line and count see the status the client got

    app.include_router(health.router)  # /healthz and /readyz (no key: probes)
    # A request is matched against the routers in this order, at 5-50 µs per router it passes
    # (FastAPI's included routers), so the ones every job goes through come first: the
    # workers' claims and reports, then the calls. No path matches routes of two routers
    # (tests/unit/test_routes.py), so the order changes nothing else.
    hot = (internal, jobs, openai, openai_completions, responses)
    for module in (*hot, deployments, batches, files, webhooks, billing, keys, logs):
        app.include_router(module.router)
    app.include_router(metrics.router)  # /metrics and /metrics/workers (operator only)
    app.include_router(console.router)  # the web console's page and files (/console)
    return app

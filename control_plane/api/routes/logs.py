"""`GET /v1/logs`: a job's, a worker's or a deployment's log lines, for the caller's tenant.

    GET /v1/logs?job=job_…&since=15m&limit=200      {"data": [line, …], "truncated": false}
    GET /v1/logs?deployment=demo&follow=true        application/x-ndjson: a line per log line

Lines are the platform's JSON log lines (common/logs.py: ids, sizes, timings, reasons; never
a prompt or an output). With `follow`, the last `limit` lines come first, then new ones as
they are written until the client goes away; a blank line every KEEPALIVE_EVERY_S of silence
keeps proxies from closing the answer. What is read, and who sees what: services/logs/.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from control_plane.api.context import Ctx, bearer_token
from control_plane.context import AppContext
from control_plane.domain import log_lines
from control_plane.domain.log_lines import DEFAULT_LIMIT, MAX_LIMIT, Selector
from control_plane.errors import InvalidRequest
from control_plane.providers.select import make_log_source
from control_plane.services.logs import targets
from control_plane.services.logs.reading import Follower, Logs, open_logs, read_tail

router = APIRouter(tags=["logs"])
NDJSON = "application/x-ndjson"
POLL_S = 0.25  # a followed line reaches the client this late at most (plus the log's own poll)
KEEPALIVE_EVERY_S = 10.0
RESCAN_EVERY_S = 5.0  # a followed deployment's new workers are found this late at most
# A follow starts this long before the tail was read: lines written meanwhile, or stamped by a
# clock a little behind, are not lost (those already sent are not sent twice).
OVERLAP_S = 2.0

# One line of the answer: a platform log line (docs/observability.md "Logs").
LOG_LINE = {
    "type": "object",
    "properties": {
        "timestamp": {"type": "string"},
        "level": {"type": "string"},
        "component": {"type": "string"},
        "message": {"type": "string"},
        "job_id": {"type": "string"},
        "worker_id": {"type": "string"},
        "deployment_id": {"type": "string"},
    },
    "additionalProperties": True,
}


@router.get(
    "/v1/logs",
    responses={
        200: {
            "description": "the last lines; with follow=true, then new ones as NDJSON",
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "data": {"type": "array", "items": LOG_LINE},
                            "truncated": {"type": "boolean"},
                        },
                    }
                },
                NDJSON: {"schema": LOG_LINE},
            },
        }
    },
)
async def read_logs(
    request: Request,
    ctx: Ctx,
    job: Annotated[str | None, Query(max_length=100, description="a job id")] = None,
    worker: Annotated[str | None, Query(max_length=100, description="a worker id")] = None,
    deployment: Annotated[str | None, Query(max_length=100, description="its name")] = None,
    since: Annotated[
        str | None,
        Query(max_length=64, description="ISO 8601 time, or an age: 300, 90s, 15m, 2h, 1d"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    follow: bool = False,
    authorization: Annotated[str | None, Header()] = None,
) -> Any:
    now = ctx.clock()
    since_at = _since(since, now)
    target = await run_in_threadpool(
        _resolve, ctx, authorization, job, worker, deployment, since_at
    )
    logs = _logs(request, ctx)
    if not follow:
        lines, truncated = await run_in_threadpool(read_tail, logs, target, since_at, limit)
        return JSONResponse({"data": lines, "truncated": truncated})
    return StreamingResponse(
        _follow(request, ctx, logs, target, since_at, limit, now),
        media_type=NDJSON,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _since(value: str | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    try:
        return log_lines.parse_since(value, now)
    except ValueError as exc:
        raise InvalidRequest(str(exc), errors=[{"field": "since", "message": str(exc)}]) from None


def _resolve(
    ctx: AppContext,
    authorization: str | None,
    job: str | None,
    worker: str | None,
    deployment: str | None,
    since: datetime | None,
) -> targets.Target:
    # NOTE: its own session, closed here: a follow must not hold a connection for hours
    with ctx.sessions() as session:
        who = ctx.edge.view().principal(session, bearer_token(authorization))
        who.require("read")
        return targets.resolve(
            session, who.tenant_id, job=job, worker=worker, deployment=deployment, since=since
        )


def _workers_of(ctx: AppContext, deployment_id: str, since: datetime) -> tuple[str, ...]:
    with ctx.sessions() as session:
        return targets.workers_of(session, deployment_id, since)


def _logs(request: Request, ctx: AppContext) -> Logs:
    """Where this process reads logs, made on the first read (a cluster's API client)."""
    logs: Logs | None = getattr(request.app.state, "logs", None)
    if logs is None:
        settings = ctx.settings
        logs = Logs(make_log_source(settings), settings.state_dir / "logs")
        request.app.state.logs = logs
    return logs


async def _follow(
    request: Request,
    ctx: AppContext,
    logs: Logs,
    target: targets.Target,
    since: datetime | None,
    limit: int,
    now: datetime,
) -> AsyncIterator[str]:
    lines, _ = await run_in_threadpool(read_tail, logs, target, since, limit)
    for line in lines:
        yield _ndjson(line)
    start = now - timedelta(seconds=OVERLAP_S)
    if since is not None and since > start:
        start = since
    cutoff = log_lines.iso(start)
    sent = {log_lines.key(line) for line in lines if (line.get("timestamp") or "") >= cutoff}
    sel = Selector(
        target.selector.job_id, target.selector.deployment_id, target.selector.worker_id, cutoff
    )
    follower = Follower(open_logs(logs, target.worker_ids, start, follow=True), sel)
    followed = set(target.worker_ids)
    loop = asyncio.get_running_loop()
    quiet_since = rescanned = loop.time()
    try:
        while not await request.is_disconnected():
            batch = follower.drain()
            for line in batch:
                k = log_lines.key(line)
                if k in sent:
                    sent.discard(k)  # sent with the tail already
                    continue
                yield _ndjson(line)
            t = loop.time()
            if batch:
                quiet_since = t
            elif t - quiet_since >= KEEPALIVE_EVERY_S:
                quiet_since = t
                yield "\n"
            if target.deployment_id is not None and t - rescanned >= RESCAN_EVERY_S:
                rescanned = t
                ids = await run_in_threadpool(_workers_of, ctx, target.deployment_id, start)
                new = [w for w in ids if w not in followed]
                followed.update(new)
                follower.add(open_logs(logs, new, start, follow=True, shared=False))
            if not batch:
                await asyncio.sleep(POLL_S)
    finally:
        follower.close()


def _ndjson(line: dict[str, Any]) -> str:
    return json.dumps(line, separators=(",", ":"), default=str) + "\n"

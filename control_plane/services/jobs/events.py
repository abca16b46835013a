"""Job event streams in Redis (one Stream per job): publish from anywhere, read for SSE."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.client import Pipeline

from common.protocol import (
    JOB_END_TTL_S,
    JOB_EVENTS_ENDED_TTL_S,
    JOB_EVENTS_MAXLEN,
    JOB_EVENTS_TTL_S,
    TERMINAL_EVENTS,
    EventType,
    job_end_key,
    job_events_key,
)

log = logging.getLogger(__name__)

# What `follow` yields for a tick on which Redis failed (an idle tick yields `{}`).
UNAVAILABLE: dict[str, Any] = {"unavailable": True}


class Unavailable(Exception):
    """Redis failed a read of a job's events (down, or restarted under a pooled connection)."""


def publish(r: redis.Redis, job_id: str, event: EventType, data: dict[str, Any]) -> None:
    publish_many(r, [job_id], event, data)


def publish_many(
    r: redis.Redis, job_ids: list[str], event: EventType, data: dict[str, Any]
) -> None:
    """The same event to many jobs, in one round trip."""
    if not job_ids:
        return
    pipe = r.pipeline(transaction=False)
    publish_to(pipe, job_ids, event, data)
    pipe.execute()


def publish_end(
    r: redis.Redis, job_id: str, event: EventType, data: dict[str, Any], *, waited_on: bool
) -> None:
    """A job's terminal event; `waited_on` (a sync job): also its end for `wait_end`, in the
    same round trip."""
    pipe = r.pipeline(transaction=False)
    end_to(pipe, job_id, event, data, waited_on=waited_on)
    pipe.execute()


def end_to(
    pipe: Pipeline, job_id: str, event: EventType, data: dict[str, Any], *, waited_on: bool
) -> None:
    """Queue `publish_end`'s commands on `pipe` (the caller executes it)."""
    publish_to(pipe, [job_id], event, data, ttl_s=JOB_EVENTS_ENDED_TTL_S)
    if waited_on:
        key = job_end_key(job_id)
        pipe.rpush(key, json.dumps({"type": event.value, "data": data}))
        pipe.expire(key, JOB_END_TTL_S)


def publish_to(
    pipe: Pipeline,
    job_ids: list[str],
    event: EventType,
    data: dict[str, Any],
    *,
    ttl_s: int = JOB_EVENTS_TTL_S,
) -> None:
    """Queue the same event for each job on `pipe` (the caller executes it with its other
    commands); the event is encoded once. `ttl_s`: how long the streams are kept after it."""
    body = {"type": event.value, "data": json.dumps(data)}
    for job_id in job_ids:
        key = job_events_key(job_id)
        pipe.xadd(key, body, maxlen=JOB_EVENTS_MAXLEN)  # type: ignore[arg-type]
        pipe.expire(key, ttl_s)


async def wait_end(
    r: aioredis.Redis, job_id: str, *, block_s: float = 0.5
) -> tuple[EventType, dict[str, Any]] | None:
    """A sync job's terminal event, once it is published; None after `block_s` without it.

    One blocking call that wakes only at the end, where `follow` wakes at every event (queued,
    running, each output delta). The list is rotated, not popped (BLMOVE from and to itself):
    every waiter of the job (a replayed call waits on the same job) sees its end. Redis failing
    raises Unavailable after `block_s`: the end published meanwhile may be lost, so the caller
    reads the job from the database (`callers.end_of`).
    """
    key = job_end_key(job_id)
    try:
        # (Redis takes fractional seconds; redis-py's hint says int)
        raw: Any = await r.blmove(key, key, block_s, "RIGHT", "LEFT")  # type: ignore[arg-type]
    except redis.RedisError as exc:
        log.warning("job %s: end unavailable (%s); waiting", job_id, type(exc).__name__)
        await asyncio.sleep(block_s)
        raise Unavailable(job_id) from exc
    if raw is None:
        return None
    end = json.loads(_text(raw))
    return EventType(end["type"]), end["data"]


async def follow(
    r: aioredis.Redis, job_id: str, *, block_ms: int = 1000
) -> AsyncGenerator[tuple[EventType | None, dict[str, Any]], None]:
    """Yield a job's events from the first one, blocking for new ones, until a terminal one.

    Yields `(None, {})` after each `block_ms` without events, so callers can send keep-alives.
    The caller bounds the wait (it is an async generator: cancel or stop iterating).

    Redis failing (restarted: the pooled connection is dead; or down) is waited out the same
    way, as a tick, `(None, UNAVAILABLE)`: events published meanwhile (the end among them) may
    be lost, and the caller reads the job from the database (`callers.Follow`). A sync call
    must still answer with its job, never a 500 (DESIGN §5).
    """
    key = job_events_key(job_id)
    last_id = "0-0"
    while True:
        try:
            resp: Any = await r.xread({key: last_id}, block=block_ms, count=256)
        except redis.RedisError as exc:
            log.warning(
                "job %s: event stream unavailable (%s); waiting", job_id, type(exc).__name__
            )
            await asyncio.sleep(min(block_ms, 500) / 1000)
            yield None, UNAVAILABLE
            continue
        if not resp:
            yield None, {}
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                last_id = entry_id
                event = EventType(_text(fields[b"type"]))
                yield event, json.loads(_text(fields[b"data"]))
                if event in TERMINAL_EVENTS:
                    return


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

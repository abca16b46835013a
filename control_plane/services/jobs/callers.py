"""What the caller of a job sees after its admission, whichever route it came through.

read / cancel     a job of the caller's tenant (cancel ends it through `finish.py`)
end_of            a sync job as it ended, for a caller that waits for the end alone
follow_or_cancel  a job's events until its end; a consumer that goes away cancels it
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from common.protocol import TERMINAL_EVENTS, EventType
from control_plane.context import AppContext
from control_plane.domain import endings
from control_plane.services.jobs import events, finish, job_store
from control_plane.services.jobs.local_ends import End

log = logging.getLogger(__name__)


def read(ctx: AppContext, job_id: str, tenant_id: str) -> dict[str, Any]:
    with ctx.sessions() as session:
        return job_store.to_public(job_store.get(session, tenant_id, job_id))


def cancel(ctx: AppContext, job_id: str, tenant_id: str) -> dict[str, Any]:
    """Cancel a job of this tenant unless it already ended; returns the job as it is now."""
    with ctx.sessions() as session:
        job = job_store.get(session, tenant_id, job_id)  # another tenant's job is a 404
        finish.finish(
            session, ctx.outbox, [(job_id, endings.canceled("canceled_by_user"))], ctx.clock()
        )
        return job_store.to_public(job)  # reloaded after the commit: the state it ended in


def cancel_quietly(ctx: AppContext, job_id: str, tenant_id: str) -> None:
    try:
        cancel(ctx, job_id, tenant_id)
    except Exception:
        log.exception("cancel after disconnect failed for job %s", job_id)


class CallerGone(Exception):
    """The caller of a sync job went away while it waited; the job was canceled."""


async def end_of(
    ctx: AppContext,
    job_id: str,
    tenant_id: str,
    wait_s: float,
    disconnected: Callable[[], Awaitable[bool]],
) -> dict[str, Any] | None:
    """A sync job as it ended, once it ends within `wait_s`; None when it did not (it runs on).

    Its end comes handed over in this process (`LocalEnds`: the worker's report reached it) or
    read from Redis (`events.wait_end`), whichever comes first; both carry the job as
    committed. Between reads (every half second) a caller that went away (`disconnected()`)
    cancels the job, so its worker frees the slot: CallerGone.
    """
    local = ctx.ends.expect(job_id)
    try:
        async with asyncio.timeout(wait_s):
            while True:
                end = await _end_from_either(ctx, job_id, local)
                if end is not None:
                    _event, job = end
                    if job.get("id") == job_id:
                        return job
                    return await asyncio.to_thread(read, ctx, job_id, tenant_id)
                if await disconnected():
                    await asyncio.to_thread(cancel_quietly, ctx, job_id, tenant_id)
                    raise CallerGone(job_id)
    except TimeoutError:
        return None
    finally:
        ctx.ends.forget(job_id, local)


async def _end_from_either(ctx: AppContext, job_id: str, local: asyncio.Future[End]) -> End | None:
    """The end handed over (`local`) or read from Redis, whichever first; None after the
    read's block."""
    if local.done():
        return local.result()
    remote = asyncio.ensure_future(events.wait_end(ctx.aredis, job_id, block_s=0.5))
    try:
        await asyncio.wait((local, remote), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        remote.cancel()
        raise
    if local.done():
        # The read ends within its block (the end it waits for is on its way); it consumes
        # nothing (`wait_end` rotates the list). Held until then: the loop keeps only a weak
        # reference to a task.
        _reads_left.add(remote)
        remote.add_done_callback(_left_read_done)
        return local.result()
    return remote.result()


_reads_left: set[asyncio.Future[Any]] = set()  # reads of ends handed over meanwhile


def _left_read_done(task: asyncio.Future[Any]) -> None:
    _reads_left.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception never retrieved" warning


async def follow_or_cancel(
    ctx: AppContext, job_id: str, tenant_id: str
) -> AsyncIterator[tuple[EventType | None, dict[str, Any]]]:
    """A job's events until a terminal one; if the consumer goes away first (the client
    disconnected), the job is canceled so its worker frees the slot. `None` = idle tick."""
    ended = False
    try:
        async for event, data in events.follow(ctx.aredis, job_id):
            if event in TERMINAL_EVENTS:
                ended = True
            yield event, data
    finally:
        if not ended:
            # Not awaited: this task is being cancelled itself.
            asyncio.get_running_loop().run_in_executor(None, cancel_quietly, ctx, job_id, tenant_id)

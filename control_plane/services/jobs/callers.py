"""What the caller of a job sees after its admission, whichever route it came through.

read / cancel     a job of the caller's tenant (cancel ends it through `finish.py`)
end_of            a sync job as it ended, for a caller that waits for the end alone
Follow            a job's events for a stream, true to the job: deltas that add up to its
                  output (`domain/stream_text.py`), its end even when Redis lost it; a consumer
                  that goes away cancels the job

Both waits read the job's row when its end may have been lost in Redis (`domain/row_checks.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from common.protocol import TERMINAL_EVENTS, EventType
from control_plane.context import AppContext
from control_plane.domain import endings
from control_plane.domain.row_checks import RowChecks
from control_plane.domain.states import JobStatus, is_terminal
from control_plane.domain.stream_text import Restart, Step, StreamText, Text
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
    committed; or, when Redis may have lost it, from the job's row (`RowChecks`). Between
    reads (every half second) a caller that went away (`disconnected()`) cancels the job, so
    its worker frees the slot: CallerGone.
    """
    local = ctx.ends.expect(job_id)
    checks = RowChecks(time.monotonic())
    try:
        async with asyncio.timeout(wait_s):
            while True:
                try:
                    end = await _end_from_either(ctx, job_id, local)
                    checks.redis(ok=True)
                except events.Unavailable:
                    end = None
                    checks.redis(ok=False)
                if end is not None:
                    _event, job = end
                    if job.get("id") == job_id:
                        return job
                    return await asyncio.to_thread(read, ctx, job_id, tenant_id)
                ended = await _ended_row(ctx, job_id, tenant_id, checks)
                if ended is not None:
                    return ended
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


async def _ended_row(
    ctx: AppContext, job_id: str, tenant_id: str, checks: RowChecks
) -> dict[str, Any] | None:
    """The job from its row if a read is due and it has ended (its end lost in Redis)."""
    now = time.monotonic()
    if not checks.due(now):
        return None
    try:
        job = await asyncio.to_thread(read, ctx, job_id, tenant_id)
    except Exception:  # the database failing too: the next read is due after the same wait
        log.exception("job %s: its row could not be read", job_id)
        checks.read(now)
        return None
    checks.read(now)
    if not is_terminal(job["status"]):
        return None
    log.info("job %s: its end came from its row (lost in Redis)", job_id)
    return job


class Follow:
    """A job's events for one stream consumer (`events()`), as the consumer must see them:

    - `running`, `starting`, `queued` as they come; `(None, {})` on each idle tick;
    - `output` deltas (`{"delta": text}`) that, with each `restarted` clearing what came
      before it, add up to the job's output (`StreamText`: a lost attempt's deltas dropped, a
      retry's text held back while it repeats what was sent, lost deltas filled in at the end);
      a job with `n` > 1 has one such text per choice, its deltas marked `"index": i` (none for
      the first). A delta sent as the worker streamed it carries its tokens' `logprobs` when the job
      asked for them, until the first delta that is not (then the rest are only in the output
      the terminal event carries: the deltas' entries are always a prefix of it);
    - `restarted` (`{"job_id", "attempt", "reason"}`) when the text sent cannot be continued;
    - one terminal event, the last, carrying the job; read from the row when Redis lost it.

    A consumer that goes away before the end (the client disconnected) cancels the job, so its
    worker frees the slot, unless it said `let_run()` first.
    """

    def __init__(self, ctx: AppContext, job_id: str, tenant_id: str) -> None:
        self.ctx, self.job_id, self.tenant_id = ctx, job_id, tenant_id
        # per choice (a job with n > 1 streams several texts; `index` 0 is the first)
        self.texts: dict[int, StreamText] = {0: StreamText()}
        self._logprobs_in_order: dict[int, bool] = {}
        self._cancel_on_exit = True

    def let_run(self) -> None:
        """The consumer stops reading (it told its client why); the job runs on."""
        self._cancel_on_exit = False

    async def events(self) -> AsyncIterator[tuple[EventType | None, dict[str, Any]]]:
        ctx, job_id = self.ctx, self.job_id
        checks = RowChecks(time.monotonic())
        ended = False
        try:
            async with contextlib.aclosing(events.follow(ctx.aredis, job_id)) as stream:
                async for event, data in stream:
                    if event is None:
                        checks.redis(ok=not data.get("unavailable"))
                        job = await _ended_row(ctx, job_id, self.tenant_id, checks)
                        if job is None:
                            yield None, {}
                            continue
                        event, data = finish.EVENT_OF_STATUS[JobStatus(job["status"])], job
                    else:
                        checks.redis(ok=True)
                    for step in self._steps(event, data):
                        yield step
                    if event in TERMINAL_EVENTS:
                        ended = True
                        return
        finally:
            if not ended and self._cancel_on_exit:
                # Not awaited: this task is being cancelled itself.
                asyncio.get_running_loop().run_in_executor(
                    None, cancel_quietly, ctx, job_id, self.tenant_id
                )

    def _steps(
        self, event: EventType, data: dict[str, Any]
    ) -> list[tuple[EventType, dict[str, Any]]]:
        """What the consumer sees of one event from Redis."""
        if event == EventType.RUNNING:
            attempt = data.get("attempt")
            if isinstance(attempt, int):
                for text in self.texts.values():
                    text.running(attempt)
            return [(event, data)]
        if event == EventType.OUTPUT:
            return self._output(data)
        if event in TERMINAL_EVENTS:
            steps: list[tuple[EventType, dict[str, Any]]] = []
            if event == EventType.COMPLETED:  # (a job that did not succeed: text not repaired)
                for index, output in _choice_texts(data).items():
                    steps += self._sent(self._text(index).end(output), index)
            return [*steps, (event, data)]
        return [(event, data)]

    def _text(self, index: int) -> StreamText:
        text = self.texts.get(index)
        if text is None:
            text = self.texts[index] = StreamText()
            text.running(self.texts[0].attempt)
        return text

    def _output(self, data: dict[str, Any]) -> list[tuple[EventType, dict[str, Any]]]:
        delta, index = data.get("delta"), data.get("index", 0)
        if not isinstance(delta, str) or not delta:
            return []
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 256:
            return []
        attempt, offset = data.get("attempt"), data.get("offset")
        steps = self._text(index).delta(
            delta,
            attempt if isinstance(attempt, int) else None,
            offset if isinstance(offset, int) else None,
        )
        sent = self._sent(steps, index)
        logprobs = data.get("logprobs")
        if steps != [Text(delta)]:
            self._logprobs_in_order[index] = False  # what comes next is not this delta's tokens
        elif self._logprobs_in_order.get(index, True) and isinstance(logprobs, list):
            sent[0][1]["logprobs"] = logprobs
        return sent

    def _sent(self, steps: list[Step], index: int) -> list[tuple[EventType, dict[str, Any]]]:
        out: list[tuple[EventType, dict[str, Any]]] = []
        for step in steps:
            if isinstance(step, Restart):
                data = {"job_id": self.job_id, "attempt": step.attempt, "reason": step.reason}
                out.append((EventType.RESTARTED, data))
            else:
                delta: dict[str, Any] = {"delta": step.text}
                if index:
                    delta["index"] = index
                out.append((EventType.OUTPUT, delta))
        return out


def _choice_texts(job: dict[str, Any]) -> dict[int, str]:
    """Each choice's stored text: `output.text` (the first), and `output.choices` when the
    job generated several."""
    output = job.get("output") or {}
    text = output.get("text")
    texts = {0: text if isinstance(text, str) else ""}
    for choice in output.get("choices") or []:
        if isinstance(choice, dict) and isinstance(choice.get("index"), int):
            t = choice.get("text")
            texts[choice["index"]] = t if isinstance(t, str) else ""
    return texts

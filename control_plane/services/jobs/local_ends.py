"""The ends of sync jobs, handed to a caller waiting in the same API process.

A sync caller waits for its job's end (`events.wait_end`): a blocking read of a Redis list
that the job's end fills (`finish._announce`). When the worker's report reaches the API
process where the caller waits (always, with one API process), the end need not go through
Redis to come back: `finish` hands it over here, after its commit and before its Redis round
trip, and the caller answers while that round trip is under way. The Redis list stays the way
for every other case (a report that reached another process, a caller that came back with its
idempotency key to another one), so a waiter races both and takes whichever comes first: they
carry the same committed job.

Tried and not kept: sending each sync job's report to the API process where its caller waits
(the wake-up named the process's own port), so that the handover applies with several
processes too. On two cores it moved the time rather than saving it: the answer came 0.2 ms
sooner and the claim 0.26 ms later, the one process now doing the work of two
(`bench/ab_warm_path.py --api-processes 2`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from common.protocol import EventType

End = tuple[EventType, dict[str, Any]]
_Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Future[End]]


class LocalEnds:
    """The futures of the sync jobs awaited in this process, by job id. `deliver` is called
    from the threads that run `finish`; `expect` and `forget` from the event loop."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[_Waiter]] = {}
        self._lock = threading.Lock()

    def expect(self, job_id: str) -> asyncio.Future[End]:
        """A future of `job_id`'s end; `forget` it when done waiting."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[End] = loop.create_future()
        with self._lock:
            self._waiting.setdefault(job_id, []).append((loop, future))
        return future

    def forget(self, job_id: str, future: asyncio.Future[End]) -> None:
        with self._lock:
            waiters = [w for w in self._waiting.get(job_id, []) if w[1] is not future]
            if waiters:
                self._waiting[job_id] = waiters
            else:
                self._waiting.pop(job_id, None)

    def deliver(self, job_id: str, end: End) -> bool:
        """Hand `job_id`'s end to its waiters in this process, if it has any (then True)."""
        with self._lock:
            waiters = list(self._waiting.get(job_id, ()))
        for loop, future in waiters:
            # a loop already closed (the process stops): nothing to wake, and the end's Redis
            # round trip that follows must still go out
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, end)
        return bool(waiters)


def _settle(future: asyncio.Future[End], end: End) -> None:
    if not future.done():  # the first end counts; a waiter that left cancelled nothing here
        future.set_result(end)

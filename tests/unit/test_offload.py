"""The admissions' threads (control_plane/api/offload.py): as many at once as the limit says,
the caller's context variables with them, and a limiter per event loop."""

from __future__ import annotations

import asyncio
import contextvars
import threading

from control_plane.api import offload

REQUEST = contextvars.ContextVar("request", default="none")


def test_as_many_admissions_run_at_once_as_the_limit_says() -> None:
    """Each call blocks until all have started: with fewer threads (the event loop's default
    executor has min(32, cores + 4)) the barrier would break."""
    n = offload.ADMISSION_THREADS
    barrier = threading.Barrier(n, timeout=20)

    def admission(i: int) -> tuple[int, str]:
        barrier.wait()
        return i, REQUEST.get()

    async def calls() -> list[tuple[int, str]]:
        REQUEST.set("req_1")
        return await asyncio.gather(*(offload.in_thread(admission, i) for i in range(n)))

    assert asyncio.run(calls()) == [(i, "req_1") for i in range(n)]


def test_each_event_loop_has_a_limiter_of_its_own() -> None:
    """(Test clients run apps on loops of their own, some at the same time: a limiter's
    waiters belong to one loop.)"""

    async def limiters() -> tuple[object, object, str]:
        name = await offload.in_thread(lambda: threading.current_thread().name)
        return offload._limiter(), offload._limiter(), name

    a, a_again, name = asyncio.run(limiters())
    b, _, _ = asyncio.run(limiters())
    assert a is a_again and a is not b
    assert name != threading.current_thread().name

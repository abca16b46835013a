"""The calls' blocking work (an admission: the database, Redis) on threads, with a limit of
its own.

`asyncio.to_thread` ran it on the event loop's default executor: min(32, cores + 4) threads,
6 on this machine's two cores. With 16 or 64 callers, admissions queued for one of them while
those threads waited on Redis and on SQLite's write lock. anyio's worker threads (those FastAPI
runs plain `def` routes on) hand work over and back in about half the time (47 against 87 µs
per round trip, measured on uvloop), and grow with the demand up to the limiter's tokens.
Admissions get a limiter of their own so that the workers' claims and reports, which run
under FastAPI's default limiter (40), never wait for a thread behind a burst of calls.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter

T = TypeVar("T")

# Admissions at once on threads: 40, as FastAPI's own limit for its routes. With 64 callers
# (`bench/ab_warm_path.py --admissions 6 --clients 64`, against 40): 16 admitted 0.84x as many
# jobs per second, 64 0.99x. Each spends much of its time waiting (Redis, SQLite's write lock),
# so a few threads leave the cores idle; past ~40 they queue on the GIL instead.
ADMISSION_THREADS = 40

# One limiter per event loop: anyio's limiter belongs to the loop it was made on (each test
# client runs the app on a loop of its own).
_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CapacityLimiter] = (
    weakref.WeakKeyDictionary()
)


def _limiter() -> CapacityLimiter:
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        limiter = _limiters[loop] = CapacityLimiter(ADMISSION_THREADS)
    return limiter


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a worker thread (the caller's context variables with it: the
    request's log fields), under the admissions' limiter."""
    call = functools.partial(fn, *args, **kwargs)
    return await anyio.to_thread.run_sync(call, limiter=_limiter())

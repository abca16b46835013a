"""The reconciler's traces (docs/observability.md "Traces"): a tick that acted, or that was
slow, is one trace of its own; a job the tick requeued gets a span in the job's trace.

    reconcile.tick          the tick; events: what it did (worker.start, worker.stop,
    │                       worker.lost, job.requeue, ...) with ids and reasons
    ├── workers             reap exited workers, check heartbeats
    ├── jobs                requeue orphans, expire, time out
    ├── scale               decide() per deployment; start / stop workers
    ├── pool                the warm pool
    ├── batches             batch fan-out
    ├── billing             roll segments, allocate busy time
    └── sweeps              redispatch, stale wake-ups, lost webhooks (when due)

Four ticks a second that change nothing would bury the ones that matter, so a tick is
recorded only when it acted, failed, or took SLOW_TICK_S or more; its steps are timed with two
clock reads each and drawn after it. Nothing here runs when tracing is off: `begin` returns
None and every call below does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from common import tracing

log = logging.getLogger(__name__)
SLOW_TICK_S = 1.0
FENCE_TOKEN = "platform.reconciler.fence_token"
ACTIONS = "platform.reconciler.actions"


class TickTrace:
    """What one tick did, timed, until `end` draws it (or not)."""

    def __init__(self) -> None:
        self.start_ns = time.time_ns()
        self.steps: list[tuple[str, int, int]] = []  # (name, start, end), epoch ns
        self.actions: list[tuple[str, int, dict[str, Any]]] = []  # (name, at, attributes)

    def worth_recording(self, end_ns: int, failed: bool) -> bool:
        return failed or bool(self.actions) or end_ns - self.start_ns >= SLOW_TICK_S * 1e9


_current: ContextVar[TickTrace | None] = ContextVar("platform_tick_trace", default=None)


def begin() -> TickTrace | None:
    """A tick starts: its recorder (None when tracing is off), current until `end`."""
    if not tracing.enabled():
        return None
    t = TickTrace()
    _current.set(t)
    return t


@contextlib.contextmanager
def step(t: TickTrace | None, name: str) -> Iterator[None]:
    """Time one step of the tick."""
    if t is None:
        yield
        return
    started = time.time_ns()
    try:
        yield
    finally:
        t.steps.append((name, started, time.time_ns()))


def note(name: str, **attributes: Any) -> None:
    """Something the current tick did (an event of its span): ids, counts and reasons only."""
    t = _current.get()
    if t is not None:
        kept = {k: v for k, v in attributes.items() if v is not None}  # an exit code 0 stays
        t.actions.append((name, time.time_ns(), kept))


def end(t: TickTrace | None, token: int | None, error: BaseException | None = None) -> None:
    """The tick is over: draw it if it acted, failed or was slow. Never raises: a trace must
    not fail a tick."""
    if t is None:
        return
    _current.set(None)
    try:
        _draw(t, token, error)
    except Exception:
        log.warning("could not record the tick's trace", exc_info=True)


def _draw(t: TickTrace, token: int | None, error: BaseException | None) -> None:
    end_ns = time.time_ns()
    if not t.worth_recording(end_ns, error is not None):
        return
    root = tracing.start_span(
        "reconcile.tick",
        parent=tracing.context_of(None),  # a trace of its own
        attributes={FENCE_TOKEN: token, ACTIONS: len(t.actions)},
        start_ns=t.start_ns,
    )
    if root is None:
        return
    under = tracing.parent_of(root)
    for name, start, stop in t.steps:
        s = tracing.start_span(name, parent=under, start_ns=start)
        if s is not None:
            s.end(end_time=stop)
    for name, at, attributes in t.actions:
        root.add_event(name, attributes, timestamp=at)
    if error is not None:
        tracing.failed(root, type(error).__name__)
    root.end(end_time=end_ns)


def requeued(traceparent: str | None, lost_at: datetime, now: datetime, **ids: Any) -> None:
    """`job.requeue` in a job's own trace: from its worker's death to its requeue."""
    if traceparent is not None:
        tracing.record_span("job.requeue", traceparent, lost_at, now, ids)

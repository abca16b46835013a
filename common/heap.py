"""The cyclic garbage collector in long-lived processes (API, reconciler, worker).

What a process imports at its start (frameworks, models of its schemas, mappers, torch) lives
as long as the process, yet every full collection walks it again: ~300k objects in an API
process, 0.1-0.2 s with the event loop stopped, every few tens of seconds under load. Moved to
the permanent generation once imports are done, it is never walked again; collections then
cost what requests and ticks allocate, which mostly dies by reference counting anyway.
"""

from __future__ import annotations

import gc


def settle(*, collect: bool = True, threshold: tuple[int, int, int] | None = None) -> None:
    """Freeze what exists now (after collecting its garbage unless `collect` is false: 0.1 s,
    paid only where nobody waits); `threshold`: the process's own collection thresholds."""
    if collect:
        gc.collect()
    gc.freeze()
    if threshold is not None:
        gc.set_threshold(*threshold)

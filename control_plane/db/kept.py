"""Reads a session keeps: the rows of one query, read once per session and reused until the
session writes a row of that class (flushed), rolls back, or `drop` is called (a bulk UPDATE
that no flush reports).

    rows = kept.rows(session, "services.workers.worker_records.live", Worker, lambda:
    list(session.scalars(q)))

For the reconciler's tick, where several steps ask for the same set (every live deployment,
every live worker): at a thousand deployments each read of the set costs milliseconds, and
one tick's session sees no other process's writes it must act on within the tick (rows
written meanwhile appear in the next tick's session). The kept rows are strong references,
so the session's identity map keeps those objects, and their loaded attributes, as long.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session

T = TypeVar("T")

# session.info[_KEPT]: key → (the class whose writes drop it, its rows)
_KEPT = "db.kept"


def rows(session: Session, key: str, cls: type[T], load: Callable[[], list[T]]) -> list[T]:
    """The rows kept under `key`, loaded by `load` when there are none (a copy: callers may
    change the list). Pending changes to `cls` are flushed first, so the answer is what a query
    would return."""
    if any(isinstance(o, cls) for o in (*session.new, *session.dirty, *session.deleted)):
        session.flush()  # drops what `key` kept (`_drop_on_write`)
    kept: dict[str, tuple[type, list[Any]]] = session.info.setdefault(_KEPT, {})
    entry = kept.get(key)
    if entry is None:
        entry = kept[key] = (cls, load())
    return list(entry[1])


def drop(session: Session, key: str) -> None:
    """Forget what `key` kept (after a bulk write to its class)."""
    session.info.get(_KEPT, {}).pop(key, None)


@event.listens_for(Session, "after_flush")
def _drop_on_write(session: Session, _ctx: Any) -> None:
    kept: dict[str, tuple[type, list[Any]]] | None = session.info.get(_KEPT)
    if not kept:
        return
    written = (*session.new, *session.dirty, *session.deleted)
    for key, (cls, _) in list(kept.items()):
        if any(isinstance(o, cls) for o in written):
            del kept[key]


@event.listens_for(Session, "after_soft_rollback")
def _drop_on_rollback(session: Session, _previous: Any) -> None:
    session.info.pop(_KEPT, None)

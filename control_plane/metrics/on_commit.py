"""Observations that wait for their transaction: counted once it commits, never for a rollback.

A billing segment or a worker's phase is observed where it is written, but the write may still
be rolled back: a replayed report hits a UNIQUE constraint inside a savepoint, a warm-pool
assignment that lost its race rolls its savepoint back, a request fails before its commit. So
the observation is staged on the session and runs after the outermost commit; a rollback drops
what was staged inside the transaction (or savepoint) it undoes.

>>> after_commit(session, lambda: BILLED.labels("busy", "cpu").inc(2.5))
>>> session.commit()  # now it is counted
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

log = logging.getLogger(__name__)

_KEY = "metrics.on_commit"


def after_commit(session: Session, observe: Callable[[], None]) -> None:
    """Run `observe` once the session's current transaction commits; at once when the session
    has none (what it observes is already committed)."""
    if session.get_transaction() is None:
        _run([observe])
        return
    # NOTE: staged with the innermost transaction, so a savepoint's rollback finds its own.
    tx = session.get_nested_transaction() or session.get_transaction()
    session.info.setdefault(_KEY, []).append((tx, observe))


def _run(observers: list[Callable[[], None]]) -> None:
    for observe in observers:
        try:
            observe()
        except Exception:  # a metric never fails the change it counts
            log.exception("metrics: an observation failed")


@event.listens_for(Session, "after_commit")
def _on_commit(session: Session) -> None:
    if session.get_nested_transaction() is not None:
        return  # a savepoint released: its changes may still be rolled back with its parent
    staged = session.info.pop(_KEY, None)
    if staged:
        _run([observe for _, observe in staged])


@event.listens_for(Session, "after_soft_rollback")
def _on_rollback(session: Session, previous: SessionTransaction) -> None:
    staged: list[tuple[SessionTransaction, Callable[[], None]]] | None = session.info.get(_KEY)
    if staged:
        staged[:] = [(tx, o) for tx, o in staged if not _within(tx, previous)]


@event.listens_for(Session, "after_transaction_end")
def _on_end(session: Session, transaction: SessionTransaction) -> None:
    # The outermost transaction ended without a commit (closed): nothing staged in it happened.
    if transaction.parent is None:
        session.info.pop(_KEY, None)


def _within(tx: SessionTransaction | None, ancestor: SessionTransaction) -> bool:
    while tx is not None:
        if tx is ancestor:
            return True
        tx = tx.parent
    return False


__all__ = ["after_commit"]

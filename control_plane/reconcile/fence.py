"""The reconciler's fencing token, kept in the database its actions write to.

A lease (Redis key or Kubernetes Lease: reconcile/lease.py) says which replica should lead;
it cannot stop a leader that paused (GC, a stalled host, SIGSTOP) past its lease from acting
when it wakes. So the replica that wins the lease takes a new token here (`take`), and every
transaction of its ticks begins by checking the row still holds that token (`fence`). The check
is an UPDATE: on PostgreSQL it locks the row until the transaction ends, on SQLite it takes the
database's write lock. A new leader's `take` therefore waits for the old leader's transaction in
flight, and every later transaction of the old leader finds a newer token and raises `Deposed`
before it writes a row or calls the provider (provider calls happen inside these transactions).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import event, select, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.db.models import ReconcilerFence

log = logging.getLogger(__name__)
FENCE_ID = 1  # the one row (migration 0010)


class Deposed(Exception):
    """Another replica took a newer token: this one must stop acting at once."""

    def __init__(self, token: int) -> None:
        super().__init__(f"fencing token {token} is no longer current: another replica leads")
        self.token = token


def take(sessions: sessionmaker[Session], holder: str, now: datetime) -> int:
    """The next token, now this replica's (call it once the lease is won)."""
    with sessions() as session:
        row = session.execute(
            update(ReconcilerFence)
            .where(ReconcilerFence.id == FENCE_ID)
            .values(token=ReconcilerFence.token + 1, holder=holder, taken_at=now)
            .returning(ReconcilerFence.token)
        ).one()
        session.commit()
    token: int = row[0]
    log.info("took fencing token %d", token, extra={"reason": "lease_won"})
    return token


def current(session: Session) -> tuple[int, str | None, datetime | None]:
    """The current token, its holder and when it was taken (status, diagnosis)."""
    row = session.execute(
        select(ReconcilerFence.token, ReconcilerFence.holder, ReconcilerFence.taken_at).where(
            ReconcilerFence.id == FENCE_ID
        )
    ).one()
    return row[0], row[1], row[2]


def fence(session: Session, token: int) -> None:
    """Every transaction `session` begins from now on first checks that `token` is current
    (raising `Deposed` from the statement that began it otherwise)."""

    def _check(_session: Session, _transaction: Any, connection: Any) -> None:
        held = connection.execute(
            update(ReconcilerFence)
            .where(ReconcilerFence.id == FENCE_ID, ReconcilerFence.token == token)
            .values(token=token)
        ).rowcount
        if held != 1:
            raise Deposed(token)

    event.listen(session, "after_begin", _check)

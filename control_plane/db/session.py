"""Engine and session factory; SQLite gets WAL and a busy timeout so several processes share it.

SQLite has one writer at a time. Threads of one process that race for it do not queue: the
loser polls with SQLite's busy handler, sleeping 1, 2, 5, 10 … ms between tries, while the
winner may sit without the GIL for a whole switch interval. Under concurrent requests that
turned millisecond writes into tens of milliseconds. So within a process, a write transaction
first takes a process-wide gate (a plain lock, handed over at once on commit); then it takes
SQLite's write lock itself (BEGIN IMMEDIATE), trying again every millisecond at most while a
writer of another process holds it, instead of meeting the busy handler's long sleeps.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from control_plane.db.types import load_json

# Enough pooled connections for every thread of the API's thread pool (anyio's default is 40):
# an overflow connection is closed on return, and each new one pays the PRAGMAs below.
SQLITE_POOL_SIZE = 40
GATE_TIMEOUT_S = 30.0  # = the busy timeout below
# A write transaction's wait for another process's write: tries 0.1, 0.2, 0.4, 0.8, then every
# 1 ms (SQLite's own handler: 1, 2, 5, 10, 15, 20, 25 ... ms).
BEGIN_RETRY_MIN_S = 0.0001
BEGIN_RETRY_MAX_S = 0.001
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class _GatedConnection(sqlite3.Connection):
    """A connection that holds its process's write gate from its first write to its commit
    or rollback (`sqlite3.connect(factory=…)`; the gate is set right after connecting)."""

    gate: threading.Lock
    holds_gate: bool = False

    def hold_gate(self) -> None:
        if self.holds_gate:
            return
        # Bounded like SQLite's own busy wait: two sessions of one thread that both write
        # fail as they did without the gate, instead of hanging.
        if not self.gate.acquire(timeout=GATE_TIMEOUT_S):
            raise sqlite3.OperationalError("database is locked (write gate)")
        self.holds_gate = True
        try:
            self._begin_writing()
        except BaseException:
            self._release_gate()
            raise

    def _begin_writing(self) -> None:
        """Take SQLite's write lock now, trying again every millisecond at most while another
        process holds it. SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, 25 ... ms
        between its tries: a writer that met another process's write of a few milliseconds
        (the reconciler's tick, the other API process) waited 33, 53 or 78 ms for it, which
        was the warm path's p99."""
        if self.in_transaction:
            return
        self.execute("PRAGMA busy_timeout=0")
        try:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            delay = BEGIN_RETRY_MIN_S
            while True:
                try:
                    self.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    # SQLITE_BUSY alone: another writer holds the lock. An extended busy code
                    # (a stale snapshot, a recovery) does not clear by waiting: raised at once,
                    # as SQLite's own handler would.
                    if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
                        raise
                    if time.monotonic() > deadline:
                        raise
                time.sleep(delay)
                delay = min(BEGIN_RETRY_MAX_S, delay * 2)
        finally:
            self.execute(f"PRAGMA busy_timeout={int(GATE_TIMEOUT_S * 1000)}")

    def _release_gate(self) -> None:
        if self.holds_gate:
            self.holds_gate = False
            self.gate.release()

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self._release_gate()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._release_gate()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release_gate()


def make_engine(database_url: str, idle_transaction_s: float | None = None) -> Engine:
    """Create the engine for `database_url` (sqlite:///path or postgresql+psycopg://...).
    `idle_transaction_s`: PostgreSQL ends a session whose transaction sat idle this long (its
    locks with it); SQLite has no such limit."""
    if database_url.startswith("sqlite"):
        return _sqlite_engine(database_url)
    connect_args = {}
    if idle_transaction_s is not None:
        ms = int(idle_transaction_s * 1000)
        connect_args["options"] = f"-c idle_in_transaction_session_timeout={ms}"
    return create_engine(
        database_url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=10,
        connect_args=connect_args,
        json_deserializer=load_json,
    )


def _sqlite_engine(database_url: str) -> Engine:
    gate = threading.Lock()
    engine = create_engine(
        database_url,
        connect_args={"timeout": GATE_TIMEOUT_S, "factory": _GatedConnection},
        pool_size=SQLITE_POOL_SIZE,
        max_overflow=SQLITE_POOL_SIZE,
        json_deserializer=load_json,
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.gate = gate
        cur = dbapi_conn.cursor()
        # WAL lets the API, the Celery worker and the reconciler read while one writes.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(GATE_TIMEOUT_S * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "before_cursor_execute")
    def _gate_writes(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        # The driver opens the transaction implicitly at the first write (not at a read), so
        # that is when this thread must own the gate; commit or rollback hands it back.
        if statement.lstrip()[:7].upper().startswith(_WRITES):
            dbapi = conn.connection.dbapi_connection
            if isinstance(dbapi, _GatedConnection):
                dbapi.hold_gate()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)

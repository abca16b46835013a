"""Write transactions on SQLite meeting another process's write: they wait for it, briefly.

The other process is a plain sqlite3 connection to the same file, with no gate (what a writer
of another process is to this one's gate)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from control_plane.db.session import GATE_TIMEOUT_S, make_engine


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    path = tmp_path / "writers.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE rows (id TEXT PRIMARY KEY)")
    return path


def test_a_write_waits_for_another_process_s_write_and_starts_right_after(db_file: Path) -> None:
    """SQLite's own busy handler tries at 1, 3, 8, 18, 33, 53, 78, 103, 128, 178 ms: a lock
    released at 130 ms was taken at 178 ms, 48 ms late. The gate tries every millisecond."""
    other = sqlite3.connect(db_file, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # the other process's write, held
    engine = make_engine(f"sqlite:///{db_file}")
    released: list[float] = []  # when the other's COMMIT began, and when it returned

    def release() -> None:
        released.append(time.monotonic())
        other.execute("COMMIT")  # (its fsync can take as long as the wait measured, or longer)
        released.append(time.monotonic())

    timer = threading.Timer(0.13, release)
    try:
        with engine.connect() as conn:
            timer.start()
            conn.execute(text("INSERT INTO rows (id) VALUES ('t1')"))
            began = time.monotonic()  # the INSERT has run: this connection holds the lock
            conn.commit()
            busy_ms = conn.execute(text("PRAGMA busy_timeout")).scalar()
    finally:
        timer.join()
        other.close()
        engine.dispose()
    assert released and began > released[0], "the write ran before the other one's commit"
    late_ms = (began - released[1]) * 1000
    assert late_ms < 25, f"the write began {late_ms:.0f} ms after the lock was free"
    # SQLite's own wait stays in place for everything else (reads, a commit's checkpoint)
    assert busy_ms == int(GATE_TIMEOUT_S * 1000)


def test_a_write_of_the_same_process_after_a_rollback_takes_the_lock_again(db_file: Path) -> None:
    """The lock taken before the first write goes with the rollback, as with a commit: the
    next transaction, and another process, can write."""
    engine = make_engine(f"sqlite:///{db_file}")
    try:
        with engine.connect() as conn:
            conn.execute(text("INSERT INTO rows (id) VALUES ('t1')"))
            conn.rollback()
            conn.execute(text("INSERT INTO rows (id) VALUES ('t2')"))
            conn.commit()
        other = sqlite3.connect(db_file, isolation_level=None, timeout=0)
        other.execute("BEGIN IMMEDIATE")  # free: nothing holds it
        other.execute("ROLLBACK")
        rows = other.execute("SELECT id FROM rows").fetchall()
        other.close()
    finally:
        engine.dispose()
    assert rows == [("t2",)]

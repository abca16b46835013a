"""Ids: prefixed, time-ordered, with a random part that never repeats across a fork."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from control_plane.domain import ids
from control_plane.domain.ids import POOL_BYTES, new_id

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_ids_sort_by_time_and_do_not_repeat() -> None:
    many = [new_id("job", T0) for _ in range(3 * POOL_BYTES)]  # across several pool refills
    assert len(set(many)) == len(many)
    assert all(i.startswith("job_") and len(i) == 4 + 12 + 10 for i in many)
    assert new_id("job", T0) < new_id("job", T0 + timedelta(milliseconds=1))


def test_a_forked_child_does_not_reuse_its_parents_random_bytes() -> None:
    new_id("job", T0)  # the parent has a pool with bytes left
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, new_id("job", T0).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert child != new_id("job", T0)  # the parent's next id: another random part
    assert ids._pos > 0

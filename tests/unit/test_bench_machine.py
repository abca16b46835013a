"""The machine's wake-up round trip (bench/machine.py): measured, and no process left behind."""

from __future__ import annotations

import os

from bench.machine import wake_round_trips_us


def test_round_trips_are_measured_and_the_echo_process_ends() -> None:
    before = _children()  # servers that other tests' fixtures started may be among them
    times = wake_round_trips_us(50)
    assert len(times) == 50 and all(t > 0 for t in times)
    # the forked echo process was reaped: no child of this process is left, zombie or not
    assert _children() - before == set()


def _children() -> set[str]:
    return {p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()}


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None

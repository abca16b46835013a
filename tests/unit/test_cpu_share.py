"""bench/cpu_share.py: the CPU a measurement's processes used, read from /proc."""

from __future__ import annotations

import os
import time

from bench.cpu_share import TICKS, Sampler, kind_of


def test_processes_are_told_apart_by_their_command_line() -> None:
    assert kind_of("python -m control_plane.api", 1) == "api"
    assert kind_of("python -m control_plane.embedded up --port 8000", 1) == "supervisor"
    assert kind_of("python -m worker --deployment d", 1) == "worker"
    assert kind_of("postgres: platform db 127.0.0.1(5432) idle", 1) == "database"
    assert kind_of("/x/redis-server 127.0.0.1:6379", 1) == "redis"
    assert kind_of("python -m pytest", os.getpid()) == "bench client"
    assert kind_of("sshd: root", 1) == "other"


def test_a_busy_loop_shows_as_this_process_and_as_machine_time() -> None:
    with Sampler() as s:
        end = time.process_time() + 0.3  # this process's own CPU, however loaded the machine
        while time.process_time() < end:
            pass
    share = s.share
    assert share.seconds > 0
    used = share.by_kind["bench client"] * share.seconds  # CPU seconds
    assert 0.25 <= used <= share.seconds * share.cores
    assert share.busy_cores * share.seconds >= used * 0.9
    assert "bench client" in share.line()


class _Answer:
    def __init__(self, status_code: int, job: str) -> None:
        self.status_code = status_code
        self._job = job

    def json(self) -> dict[str, str]:
        return {"id": self._job}


class _Client:
    """Answers every third call 429, the others 202; spends CPU on each (a client's own)."""

    def close(self) -> None:
        pass


def _call(_client: _Client, i: int) -> _Answer:
    end = time.thread_time() + 0.002
    while time.thread_time() < end:
        pass
    return _Answer(429 if i % 3 == 2 else 202, f"job_{i}")


def test_load_spread_over_forked_processes_is_all_counted() -> None:
    """bench/controlplane/load.hammer with client processes: every process's answers come back,
    each call once, and the processes' CPU counts as the bench client's though they are gone
    from /proc when the sampler reads it last."""
    from bench.controlplane.load import hammer

    for processes in (1, 3):
        ids, refused, share = hammer(_Client, _call, 6, 0.3, processes)
        assert ids and len(ids) == len(set(ids))
        assert refused and set(refused) == {429}
        calls = len(ids) + refused[429]
        # each call spent 2 ms of its thread's CPU: at least that much is counted (less two
        # clock ticks: /proc counts whole ticks)
        assert share.by_kind["bench client"] * share.seconds >= calls * 0.002 - 2 / TICKS
        # clients k = 0..5 each made calls k * 1_000_000 + 0, 1, 2, ...
        assert {int(j.removeprefix("job_")) // 1_000_000 for j in ids} == set(range(6))

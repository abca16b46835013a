"""bench/cpu_share.py: the CPU a measurement's processes used, read from /proc."""

from __future__ import annotations

import os
import time

from bench.cpu_share import Sampler, kind_of


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

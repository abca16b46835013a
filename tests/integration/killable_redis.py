"""A redis-server of a test's own, with its AOF, that the test kills (SIGKILL) and starts again
on the same port, as the embedded supervisor does: what rides out a Redis restart is tested on
it (the session's redis-server must not die)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from control_plane.embedded.processes import ManagedProcess, free_port, start_redis


class KillableRedis:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir, self.port = data_dir, free_port()
        self.proc: ManagedProcess = self._start()
        self.url: str = self.proc.extra["url"]

    def _start(self) -> ManagedProcess:
        return start_redis(self.data_dir, self.port, self.data_dir / "redis.log", appendonly=True)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.popen.wait(10)

    def start(self) -> None:
        self.proc = self._start()

    def restart(self, down_s: float = 1.0) -> None:
        """SIGKILL, down for `down_s` (about the supervisor's restart), then up again."""
        self.kill()
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        self.proc.stop()


@contextmanager
def killable_redis(data_dir: Path) -> Iterator[KillableRedis]:
    server = KillableRedis(data_dir)
    try:
        yield server
    finally:
        server.stop()

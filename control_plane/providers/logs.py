"""Where a worker's log lines are read, whatever runs it: the `LogSource` protocol and its
local implementation (a file per worker, `<log dir>/<worker id>.log`, as `LocalProvider`
writes them; the platform processes' own files the same way). The Kubernetes one reads the
worker pod's log through the API (`kubernetes/pod_logs.py`).

A source hands back raw text lines, oldest first, as a `LogStream`: iterate it; with
`follow`, it waits for new lines until closed (from any thread: `close()` wakes a reader
blocked on it). Lines are not parsed or filtered here: `since` is a hint a source may use to
skip older lines (Kubernetes' `sinceSeconds`); the exact filtering is `domain/log_lines.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Protocol

# How often a followed file is checked for new lines: a reader sees a line this late at most.
FOLLOW_POLL_S = 0.2
READ_BYTES = 64 * 1024


class LogStream(Protocol):
    def __iter__(self) -> Iterator[str]:
        """The lines (without their newline), oldest first; with follow, until closed."""
        ...

    def close(self) -> None:
        """Stop: a reader blocked waiting for lines wakes and its iteration ends."""
        ...


class LogSource(Protocol):
    def logs(self, worker_id: str, since: datetime | None, follow: bool) -> LogStream:
        """The worker's log lines (those before `since` may be skipped); with `follow`, new
        lines as they are written, until the stream is closed. A worker with no log (never
        started here, or its pod gone) gives an empty stream."""
        ...


class FileLines:
    """The lines of one file; with `follow`, lines appended later too (a file that does not
    exist yet is waited for). A last line without its newline is held until it has one, so a
    line being written is never cut in two."""

    def __init__(self, path: Path, follow: bool, poll_s: float = FOLLOW_POLL_S) -> None:
        self.path = path
        self.follow = follow
        self.poll_s = poll_s
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[str]:
        handle = None
        try:
            while handle is None:
                try:
                    handle = self.path.open("rb")
                except FileNotFoundError:
                    if not self.follow or self._closed.wait(self.poll_s):
                        return
            partial = b""
            while not self._closed.is_set():
                chunk = handle.read(READ_BYTES)
                if chunk:
                    *lines, partial = (partial + chunk).split(b"\n")
                    for line in lines:
                        yield line.decode(errors="replace")
                    continue
                if not self.follow:
                    if partial:
                        yield partial.decode(errors="replace")
                    return
                self._closed.wait(self.poll_s)
        finally:
            if handle is not None:
                handle.close()

    def close(self) -> None:
        self._closed.set()


class LocalLogs:
    """The local provider's worker logs: `<log_dir>/<worker id>.log`. Example:

    for line in LocalLogs(state_dir / "logs" / "workers").logs("wrk_…", None, False): ...
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    def logs(self, worker_id: str, since: datetime | None, follow: bool) -> LogStream:
        # a worker id names a file in this directory, never a path out of it
        name = Path(worker_id).name
        if name != worker_id or not name:
            return FileLines(self.log_dir / ".none", follow=False)
        return FileLines(self.log_dir / f"{name}.log", follow)


__all__ = ["FOLLOW_POLL_S", "FileLines", "LocalLogs", "LogSource", "LogStream"]

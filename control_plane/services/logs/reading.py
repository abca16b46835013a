"""Reading the logs of a `Target` (targets.py): the last lines at once (`read_tail`), or new
lines as they are written (`Follower`: a thread per log, feeding one queue the API drains).

Two kinds of log: each worker's own (its provider's `LogSource`: a file, or its pod's log) and
the platform processes' files where this host has them (the embedded platform's
`<state dir>/logs/{api*,celery,reconciler}.log`; in a cluster those processes log to their
pods' output, collected by the cluster's log pipeline, and are not read here).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from control_plane.domain import log_lines
from control_plane.domain.log_lines import Selector
from control_plane.providers.logs import FileLines, LogSource, LogStream
from control_plane.services.logs.targets import Target

# The platform processes' logs in the embedded platform's log directory (docs/observability.md).
PLATFORM_LOG_PATTERNS = ("api*.log", "celery.log", "reconciler.log")


@dataclass(frozen=True, slots=True)
class Logs:
    """Where this process reads logs."""

    workers: LogSource  # each worker's own log (providers/select.py::make_log_source)
    platform_dir: Path | None  # the platform processes' log files, if this host has them


@dataclass(frozen=True, slots=True)
class Opened:
    stream: LogStream  # the raw lines
    own: bool  # a worker's own log (the tenant's), else a platform process's (shared)
    worker_id: str | None  # the worker of an own log


def platform_files(logs: Logs) -> list[Path]:
    if logs.platform_dir is None:
        return []
    found = {p for pattern in PLATFORM_LOG_PATTERNS for p in logs.platform_dir.glob(pattern)}
    return sorted(p for p in found if p.is_file())


def open_logs(
    logs: Logs,
    worker_ids: Iterable[str],
    since: datetime | None,
    follow: bool,
    shared: bool = True,
) -> list[Opened]:
    """Streams of the workers' logs and, with `shared`, of the platform processes' files."""
    out = [Opened(logs.workers.logs(w, since, follow), True, w) for w in worker_ids]
    if shared:
        out += [Opened(FileLines(p, follow), False, None) for p in platform_files(logs)]
    return out


def selected(opened: Opened, sel: Selector) -> Iterable[dict[str, Any]]:
    return log_lines.select(opened.stream, sel, own=opened.own, worker_id=opened.worker_id)


def read_tail(
    logs: Logs, target: Target, since: datetime | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """The target's last `limit` lines (from `since`), oldest first, and whether older ones
    were left out."""
    opened = open_logs(logs, target.worker_ids, since, follow=False)
    try:
        return log_lines.tail([selected(o, target.selector) for o in opened], limit)
    finally:
        for o in opened:
            o.stream.close()


class Follower:
    """New lines of several logs as they are written: a thread per log puts the lines the
    tenant sees on one queue; `drain()` takes what arrived. `close()` ends every thread (a
    thread blocked on its log wakes: LogStream.close). Example:

    follower = Follower(open_logs(logs, ids, since, follow=True), selector)
    lines = follower.drain(); ...; follower.close()
    """

    def __init__(self, opened: list[Opened], sel: Selector) -> None:
        self._sel = sel
        self._lines: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._opened: list[Opened] = []
        self._lock = threading.Lock()
        self._closed = False
        self.add(opened)

    def add(self, opened: list[Opened]) -> None:
        with self._lock:
            if self._closed:
                for o in opened:
                    o.stream.close()
                return
            self._opened += opened
        for o in opened:
            threading.Thread(target=self._pump, args=(o,), name="log-follow", daemon=True).start()

    def _pump(self, opened: Opened) -> None:
        try:
            for line in selected(opened, self._sel):
                self._lines.put(line)
        except Exception:  # a log that broke off (its pod went away): the others go on
            pass
        finally:
            opened.stream.close()

    def drain(self, at_most: int = 1_000) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < at_most:
            try:
                out.append(self._lines.get_nowait())
            except queue.Empty:
                break
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, []
        for o in opened:
            o.stream.close()


__all__ = ["PLATFORM_LOG_PATTERNS", "Follower", "Logs", "Opened", "open_logs", "read_tail"]

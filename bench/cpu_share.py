"""Where the machine's CPU went during a measurement, by kind of process, from /proc.

A throughput bench on a small machine must say whether the machine was the limit: a second
API process cannot admit more when the cores are already busy, and the load generator's own
threads take their share of the same cores. `Sampler` reads every process's CPU time
(utime + stime) before and after, and the machine's busy time from /proc/stat.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

# A process's kind, by the first of these found in its command line (in this order: the
# embedded supervisor's command line names the API too).
KINDS = (
    ("supervisor", "control_plane.embedded"),
    ("api", "control_plane.api"),
    ("reconciler", "control_plane.reconcile"),
    ("celery", "celery"),
    ("worker", "-m worker"),
    ("database", "postgres"),
    ("redis", "redis-server"),
    ("s3", "rclone"),
)
TICKS = os.sysconf("SC_CLK_TCK")


def kind_of(cmdline: str, pid: int) -> str:
    if pid == os.getpid():
        return "bench client"
    for kind, needle in KINDS:
        if needle in cmdline:
            return kind
    return "other"


def _processes() -> dict[int, tuple[str, float]]:
    """Every process's kind and CPU seconds so far."""
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        # the fields after the command's name, which may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        pid = int(entry.name)
        out[pid] = (kind_of(cmdline, pid), cpu)
    return out


def _machine() -> tuple[float, float]:
    """The machine's busy and total CPU seconds so far (all cores)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    total = sum(values[:8])  # guest time is counted in user already
    return (total - idle) / TICKS, total / TICKS


@dataclass(frozen=True)
class Share:
    seconds: float
    cores: int
    busy_cores: float  # the machine's, on average
    by_kind: dict[str, float]  # cores on average, per kind of process

    def plus(self, kind: str, cpu_seconds: float) -> Share:
        """This share with `cpu_seconds` more for `kind`: a process that had ended before
        the sampler's last reading (a bench's own forked load processes)."""
        by_kind = {**self.by_kind, kind: self.by_kind.get(kind, 0.0) + cpu_seconds / self.seconds}
        return replace(self, by_kind=by_kind)

    def line(self) -> str:
        kinds = ", ".join(
            f"{k} {v:.2f}"
            for k, v in sorted(self.by_kind.items(), key=lambda kv: -kv[1])
            if v >= 0.01
        )
        return f"cores busy {self.busy_cores:.2f} of {self.cores}: {kinds}"


class Sampler:
    """`with Sampler() as s: ...` then `s.share`."""

    def __enter__(self) -> Sampler:
        self._procs = _processes()
        self._busy, self._total = _machine()
        return self

    def __exit__(self, *exc: object) -> None:
        procs = _processes()
        busy, total = _machine()
        cores = os.cpu_count() or 1
        seconds = (total - self._total) / cores
        by_kind: dict[str, float] = {}
        for pid, (kind, cpu) in procs.items():
            before = self._procs.get(pid)
            used = cpu - (before[1] if before and before[0] == kind else 0.0)
            by_kind[kind] = by_kind.get(kind, 0.0) + used / seconds
        self.share = Share(seconds, cores, (busy - self._busy) / seconds, by_kind)

"""Provider protocol: how workers are started and stopped (local processes, Kubernetes pods)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from common.messages import Assignment
from control_plane.providers.logs import LogStream


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: str  # id of the Worker row created before the start
    accelerator: str  # cpu, h100, ...
    # What it serves; None: a warm-pool worker, which boots, then waits for its assignment
    # (`common.protocol.worker_assignment_key`).
    assignment: Assignment | None
    # A warm-pool worker's engine, which it prepares at its boot (its interpreter or image is
    # that engine's); a worker started for a deployment runs its assignment's.
    pool_engine: str = "builtin"

    @property
    def engine(self) -> str:
        """The engine it runs: its environment (vLLM's python or image) follows from it."""
        return self.assignment.engine if self.assignment is not None else self.pool_engine


@dataclass(frozen=True, slots=True)
class Exited:
    worker_id: str  # the worker whose process ended
    returncode: int  # its exit status (negative: killed by that signal)
    # why, when the exit status does not say it (a pod that could not start:
    # providers/kubernetes/stuck.py); None: `exit_<returncode>`
    reason: str | None = None


class Provider(Protocol):
    def start(self, spec: WorkerSpec) -> int | None:
        """Start a worker; returns its pid when there is one."""

    def stop(self, worker_id: str) -> None:
        """Ask a worker to drain: finish what it holds, then exit (after reporting `stopped`
        it may finish its cache-tier fill, for a bounded time: the next worker's hit)."""

    def kill(self, worker_id: str) -> None:
        """Stop a worker now, without draining (it stopped heartbeating or overran its boot)."""

    def reap(self) -> list[Exited]:
        """Workers whose process ended since the last call."""

    def waiting(self) -> dict[str, str]:
        """Workers whose start is held up outside them, and why (a pod no node can take yet);
        what their waiting callers are told (domain/cold_start.py)."""

    def shutdown(self, timeout_s: float) -> list[Exited]:
        """This reconciler process stops: stop the workers only it can reach (its child
        processes: drain, no cache-tier fill, then kill after timeout_s) and return those that
        ended; workers every replica reaches (pods) keep serving for the next leader."""

    def logs(self, worker_id: str, since: datetime | None, follow: bool) -> LogStream:
        """A worker's log lines (providers/logs.py::LogSource): from its file, or its pod's
        log through the Kubernetes API; with `follow`, new lines until the stream is closed."""

    def step_down(self) -> None:
        """This replica stopped leading (reconcile/lease.py). Workers only it can reach (its
        child processes) drain, since the new leader could never stop them; workers every
        replica reaches (pods) are the new leader's to manage."""

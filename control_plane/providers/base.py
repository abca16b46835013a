"""Provider protocol: how workers are started and stopped (local processes, Kubernetes pods)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: str  # id of the Worker row created before the start
    deployment_id: str  # deployment the worker serves
    deployment_version: int  # spec version it was started for
    model_uri: str  # weights location as read (s3://, file://, hf://), tenancy resolved
    accelerator: str  # cpu, h100, ...
    queue: str  # broker queue it consumes
    max_concurrency: int  # jobs it may hold at once
    # The storage credentials of this deployment's tenant for that location, and only those
    # (AWS_*, HF_TOKEN): a worker never holds what its deployment may not read.
    storage_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Exited:
    worker_id: str  # the worker whose process ended
    returncode: int  # its exit status (negative: killed by that signal)


class Provider(Protocol):
    def start(self, spec: WorkerSpec) -> int | None:
        """Start a worker; returns its pid when there is one."""

    def stop(self, worker_id: str) -> None:
        """Ask a worker to drain: finish what it holds, then exit."""

    def kill(self, worker_id: str) -> None:
        """Stop a worker now, without draining (it stopped heartbeating or overran its boot)."""

    def reap(self) -> list[Exited]:
        """Workers whose process ended since the last call."""

    def shutdown(self, timeout_s: float) -> list[Exited]:
        """Stop every worker (drain, then kill after timeout_s)."""

"""Local provider: one worker process per accelerator (or the CPU), children of this process.

Children get PR_SET_PDEATHSIG so that they die with the loop process even if it is killed
with SIGKILL: the embedded platform never leaves orphans.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from common.messages import ASSIGNMENT_ENV
from common.protocol import (
    CREDENTIAL_ENV,
    METRICS_HOST_ENV,
    METRICS_PORT_ENV,
    WORKER_ENV_PREFIXES,
)
from control_plane.providers.base import Exited, WorkerSpec
from control_plane.providers.logs import LocalLogs, LogStream

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
# The control plane's own metrics directory (prometheus_client's multiprocess mode): a worker
# that inherited it would write its families there, into the control plane's /metrics.
CONTROL_PLANE_ONLY_ENV = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


def die_with_parent() -> None:
    """preexec_fn: deliver SIGTERM to this child when its parent thread exits (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class LocalProvider:
    """Workers as child processes: `python -m worker`, with the vLLM environment's python
    (PLATFORM_VLLM_PYTHON) for a worker whose engine is vllm (its assignment's, or a vLLM
    warm-pool worker's)."""

    def __init__(
        self, env: Mapping[str, str], log_dir: Path, python: str = "", vllm_python: str = ""
    ) -> None:
        self._env = dict(env)
        self._log_dir = log_dir
        self._python = python or sys.executable
        self._vllm_python = vllm_python
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs = LocalLogs(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)

    def interpreter(self, spec: WorkerSpec) -> str:
        """The python a worker runs with: its engine's environment."""
        if spec.engine != "vllm":
            return self._python  # the built-in engine
        if not self._vllm_python:
            # Chosen while this platform had vLLM: the worker fails to import it and says so
            # (its crash-loop reason), rather than a tick failing here.
            log.warning(
                "worker %s: engine vllm, but PLATFORM_VLLM_PYTHON is not set",
                spec.worker_id,
                extra={"worker_id": spec.worker_id},
            )
            return self._python
        return self._vllm_python

    def start(self, spec: WorkerSpec) -> int | None:
        cmd = [self.interpreter(spec), "-m", "worker", *worker_args(spec)]
        # Its /metrics on loopback, on a port free now; should another process take the port
        # first, the worker binds any other and its heartbeat says which (metrics/targets.py).
        metrics_env = {METRICS_HOST_ENV: "127.0.0.1", METRICS_PORT_ENV: str(_free_port())}
        logfile = (self._log_dir / f"{spec.worker_id}.log").open("ab")
        proc = subprocess.Popen(
            cmd,
            env={**self._env, **assignment_env(spec), **metrics_env},
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        logfile.close()
        self._procs[spec.worker_id] = proc
        log.info(
            "started worker %s pid %d",
            spec.worker_id,
            proc.pid,
            extra={"worker_id": spec.worker_id},
        )
        return proc.pid

    def stop(self, worker_id: str) -> None:
        proc = self._procs.get(worker_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def kill(self, worker_id: str) -> None:
        proc = self._procs.get(worker_id)
        if proc is not None and proc.poll() is None:
            proc.kill()

    def waiting(self) -> dict[str, str]:
        """A child process starts at once: nothing holds one up."""
        return {}

    def reap(self) -> list[Exited]:
        out = []
        for worker_id, proc in list(self._procs.items()):
            rc = proc.poll()
            if rc is not None:
                del self._procs[worker_id]
                out.append(Exited(worker_id, rc))
        return out

    def shutdown(self, timeout_s: float) -> list[Exited]:
        # SIGINT, not SIGTERM: drain like a scale-down, but do not stay for the cache-tier fill
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        while self._procs and time.monotonic() < deadline:
            if all(p.poll() is not None for p in self._procs.values()):
                break
            time.sleep(0.05)
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return self.reap()

    def logs(self, worker_id: str, since: datetime | None, follow: bool) -> LogStream:
        return self._logs.logs(worker_id, since, follow)

    def step_down(self) -> None:
        # They finish their jobs and report `stopped` themselves; their rows are the new
        # leader's, which requeues the jobs of any that die instead.
        for worker_id in self.running():
            self.stop(worker_id)
        if self._procs:
            log.info("drained %d local workers: no longer leading", len(self._procs))

    def running(self) -> list[str]:
        return [w for w, p in self._procs.items() if p.poll() is None]


def worker_args(spec: WorkerSpec) -> list[str]:
    """The arguments of `python -m worker` for this worker (every provider's command line):
    who it is; what it serves comes in its environment (`assignment_env`), or, with `--pool`,
    later through Redis (a pool worker prepares its `--engine` meanwhile)."""
    args = ["--worker-id", spec.worker_id, "--accelerator", spec.accelerator]
    return args if spec.assignment is not None else [*args, "--pool", "--engine", spec.engine]


def assignment_env(spec: WorkerSpec) -> dict[str, str]:
    """The environment that carries a directly started worker's assignment (with its storage
    credentials): the one encoding, `Assignment.to_json`; none for a warm-pool worker."""
    if spec.assignment is None:
        return {}
    return {ASSIGNMENT_ENV: spec.assignment.to_json()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def worker_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """A worker's environment: the control plane's, minus its PLATFORM_* settings and its
    storage credentials (secrets both), plus `extra`; engine and loader tuning and log
    settings (WORKER_ENV_PREFIXES) pass through, the control plane's metrics directory does
    not. Each worker gets its deployment's storage credentials with its assignment
    (`Assignment.storage_env`)."""
    env = {
        k: v
        for k, v in base.items()
        if (not k.startswith("PLATFORM_") or k.startswith(WORKER_ENV_PREFIXES))
        and k not in CREDENTIAL_ENV
        and k not in CONTROL_PLANE_ONLY_ENV
    }
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


__all__ = ["LocalProvider", "assignment_env", "die_with_parent", "worker_args", "worker_env"]

"""What the embedded platform runs when the environment does not say: how many API and
reconciler processes (and their names), how much host memory the weight cache may take, and
which vLLM environment its workers use."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from control_plane.embedded.processes import StartError
from control_plane.settings import MAX_API_PROCESSES, MAX_RECONCILERS


def default_host_cache_bytes(shm: str = "/dev/shm") -> int:
    """The embedded platform's host-memory weight tier: a quarter of the host's shared memory,
    at most 8 GiB (0, off, without a /dev/shm)."""
    try:
        return min(shutil.disk_usage(shm).total // 4, 8 << 30)
    except OSError:
        return 0


# The vLLM environment `make vllm-venv` builds, beside .venv in the repository.
VLLM_VENV = ".venv-vllm"
# The repository of this package (an editable install runs from it).
REPOSITORY = Path(__file__).resolve().parents[2]


def default_vllm_python(repository: Path = REPOSITORY, prefix: Path = Path(sys.prefix)) -> str:
    """PLATFORM_VLLM_PYTHON when the environment does not set it: the python of the
    repository's .venv-vllm (an editable install runs from the repository), or of one beside
    the virtualenv this runs in; "" (no vLLM) when there is neither."""
    for root in (repository, prefix.parent):
        python = root / VLLM_VENV / "bin" / "python"
        if python.exists():
            return str(python)
    return ""


def default_api_processes() -> int:
    """API processes when PLATFORM_API_PROCESSES is not set: two on a machine with two cores or
    more. One process is held by its own event loop and GIL at about one core; a second one
    took the async admissions 1.4-1.7x higher on 2 cores with SQLite (docs/benchmarks.md,
    "Control plane"), and more than two would mostly queue on SQLite's one writer."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def api_names(env: dict[str, str]) -> list[str]:
    """The API processes to start: `api`, then `api-2`, `api-3`... (PLATFORM_API_PROCESSES,
    else `default_api_processes`)."""
    env = {"PLATFORM_API_PROCESSES": str(default_api_processes()), **env}
    return _replica_names(env, "PLATFORM_API_PROCESSES", "api", MAX_API_PROCESSES)


def reconciler_names(env: dict[str, str]) -> list[str]:
    """The reconciler processes: `reconciler`, `reconciler-2`... (PLATFORM_RECONCILERS); each
    is its replica's name in the lease."""
    return _replica_names(env, "PLATFORM_RECONCILERS", "reconciler", MAX_RECONCILERS)


def _replica_names(env: dict[str, str], variable: str, base: str, most: int) -> list[str]:
    raw = env.get(variable, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= most:
        raise StartError(f"{variable} must be a whole number from 1 to {most}, not {raw!r}")
    return [base, *(f"{base}-{i}" for i in range(2, n + 1))]

"""Fixtures of the fault suite: one embedded platform (real processes) for the session, the
demo model on disk, and the summary of every fault run printed at the end of pytest's output.

The platform is started as `platform up --detach` and stopped with `platform down`, after
which no process mentioning its state directory may be left: faults must not leak processes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from control_plane.embedded.processes import free_port
from tests.e2e.conftest import build_demo_model, cli, processes_mentioning
from tests.faults.harness import RUNS


@pytest.fixture(scope="session")
def fault_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("fault-model") / "demo")


@pytest.fixture(scope="session")
def fault_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`platform up --detach` on a free port; `platform down` at the end, leaving nothing.

    Yields platform.json plus `env` and `state_dir`. The scenarios read `children` (pids),
    `database_url` and `redis_url` from the state file again when they need them fresh.
    """
    state_dir = tmp_path_factory.mktemp("fault-platform")
    port = free_port()
    env = {
        **os.environ,
        "PLATFORM_STATE_DIR": str(state_dir),
        # as tests/e2e: workers reach the control plane's loader cache and engine settings
        "PLATFORM_LOADER_CACHE_DIR": str(state_dir / "weights-cache"),
        "PLATFORM_ENGINE_MAX_NUM_BATCHED_TOKENS": "512",
        # the operator's admin key deploys the demo model from its host path
        "PLATFORM_ALLOW_HOST_PATHS": "true",
        # Long forms submit thousands of jobs: the tenant quota is not what is under test.
        "PLATFORM_DEFAULT_REQUESTS_PER_MIN": "1000000",
    }
    up = cli("up", "--detach", "--port", str(port), "--state-dir", str(state_dir), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((state_dir / "platform.json").read_text())
    yield {**state, "env": env, "state_dir": state_dir}
    down = cli("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    deadline = time.monotonic() + 10
    while (left := processes_mentioning(str(state_dir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes left behind: {left}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RUNS:
        return
    terminalreporter.section("fault suite")
    for run in RUNS:
        terminalreporter.write_line(run.summary())

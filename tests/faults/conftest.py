"""Fixtures of the fault suite: one embedded platform (real processes) for the session, the
demo model on disk, and the summary of every fault run printed at the end of pytest's output.

The platform is started as `platform up --detach` and stopped with `platform down`, after
which no process mentioning its state directory may be left: faults must not leak processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import build_demo_model, embedded_platform
from tests.faults.harness import RUNS


@pytest.fixture(scope="session")
def fault_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("fault-model") / "demo")


# The settings of every fault platform (a scenario with its own adds to them).
FAULT_PLATFORM_ENV = {
    # Long forms submit thousands of jobs: the tenant quota is not what is under test.
    "PLATFORM_DEFAULT_REQUESTS_PER_MIN": "1000000",
    # retries within the checker's bounds when a receiver misbehaves (the default
    # schedule waits minutes to hours); the receiver's slow answers outlast the timeout
    "PLATFORM_WEBHOOK_RETRY_SCHEDULE_S": "[0.5, 1, 2, 4, 8, 16]",
    "PLATFORM_WEBHOOK_TIMEOUT_S": "2",
}


@pytest.fixture(scope="session")
def fault_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The embedded platform (tests/e2e's `embedded_platform`); the scenarios read `children`
    (pids), `database_url` and `redis_url` from the state file again when they need them."""
    with embedded_platform(tmp_path_factory.mktemp("fault-platform"), FAULT_PLATFORM_ENV) as state:
        yield state


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RUNS:
        return
    terminalreporter.section("fault suite")
    for run in RUNS:
        terminalreporter.write_line(run.summary())

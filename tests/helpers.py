"""Plain helpers every test tier shares (fixtures live in the conftest.py files)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    timeout_s: float = 30.0,
    every_s: float = 0.05,
    what: str | None = None,
) -> T:
    """Call `condition` every `every_s` seconds until it returns something truthy, and return
    that; fail the test (AssertionError naming `what`) once `timeout_s` has passed.

    Example: `row = wait_for(lambda: ledger.job(job_id), timeout_s=10, what="the job's row")`.
    """
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, (
            f"timed out after {timeout_s:g} s waiting for {what or condition}"
        )
        time.sleep(every_s)
    return value

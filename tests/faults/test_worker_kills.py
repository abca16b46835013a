"""Workers killed with SIGKILL in the middle of a job, again and again, while async jobs keep
arriving: the reconciler reaps each dead worker, requeues its job as a new attempt and starts
a replacement. Then the one checker (invariants/) runs over the ledger, Redis and the
webhook receiver's log.

Sizes: FAULTS_JOBS (12), FAULTS_WORKER_KILLS (2); `make faults` runs the long form.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import (
    INVARIANTS,
    SIZES,
    FaultRun,
    Injector,
    run_scenario,
    scenario_marks,
    submit_long_job,
    utcnow,
)
from tests.faults.invariants import assert_holds
from tests.faults.ledger import Ledger

pytestmark = scenario_marks()


def is_worker(pid: int, worker_id: str) -> bool:
    """The pid is still that worker's process (not a pid reused since)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"worker" in cmdline and worker_id.encode() in cmdline


class BusyWorkerKiller(Injector):
    """The fault: SIGKILL the worker of a running job (None: none ran within 60 s).

    NOTE: a job on its first attempt is preferred for 30 s: the requeued job of the last kill
    is often the next to run, and a job whose worker dies MAX_ATTEMPTS times fails by policy.
    A run of many kills still hits some jobs twice; that is allowed, and I1 accepts `failed`.
    On an idle machine the submitted jobs may all have ended before the fault's turn: after
    2 s with nothing running, it submits a longer job of its own to interrupt.
    """

    def __call__(self, ledger: Ledger, deployment: str) -> datetime | None:
        started = time.monotonic()
        submitted = False
        while (waited := time.monotonic() - started) < 60:
            for _job_id, attempt, worker_id, pid in ledger.running(deployment):
                if (attempt == 1 or waited > 30) and is_worker(pid, worker_id):
                    fault_at = utcnow()
                    os.kill(pid, signal.SIGKILL)
                    return fault_at
            if waited > 2 and not submitted:
                submit_long_job(self.client, deployment, SIZES)
                submitted = True
            time.sleep(0.05)
        return None


@pytest.fixture(scope="module")
def killer(fault_platform: dict[str, Any]) -> Iterator[BusyWorkerKiller]:
    with BusyWorkerKiller(fault_platform) as k:
        yield k


@pytest.fixture(scope="module")
def run(fault_platform: dict[str, Any], fault_model: Path, killer: BusyWorkerKiller) -> FaultRun:
    return run_scenario(
        "worker_kills", fault_platform, fault_model, SIZES, SIZES.worker_kills, killer
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_after_worker_kills(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_every_kill_was_injected_and_recovered(run: FaultRun) -> None:
    assert run.faults == SIZES.worker_kills, "a kill found no running job to interrupt"
    assert run.unrecovered == 0, "no job succeeded after a kill"

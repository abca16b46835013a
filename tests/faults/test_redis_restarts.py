"""redis-server killed with SIGKILL while jobs are being submitted and run: the supervisor
restarts it on the same port from its AOF; the API may refuse submissions meanwhile (503:
not admitted), but nothing admitted may be lost, doubled or billed twice. Then the one
checker (invariants/) runs over the ledger, Redis and the webhook receiver's log.

Each restart is framed by two sync calls: one before (so the API holds a connection to the
old redis-server, as it does under any traffic) and one right after it is back (the probe).

Sizes: FAULTS_JOBS (12), FAULTS_REDIS_RESTARTS (1); `make faults` runs the long form.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sdk import APIError
from tests.e2e.conftest import alive
from tests.faults.harness import (
    INVARIANTS,
    SIZES,
    FaultRun,
    Injector,
    run_scenario,
    scenario_marks,
    utcnow,
)
from tests.faults.invariants import assert_holds
from tests.faults.ledger import Ledger

SYNC_INPUT = {"prompt": "The river", "max_tokens": 1}

pytestmark = scenario_marks()


class RedisKiller(Injector):
    """The fault: SIGKILL redis-server, return once the supervisor has started a new one;
    `probes`: per restart, how the first sync call after it went."""

    def __init__(self, platform: dict[str, Any]) -> None:
        super().__init__(platform, timeout_s=60)
        self.state_dir: Path = platform["state_dir"]

    def pid(self) -> int:
        """The supervisor's current redis-server pid (platform.json is rewritten on restarts)."""
        return int(json.loads((self.state_dir / "platform.json").read_text())["children"]["redis"])

    def __call__(self, _ledger: Ledger, deployment: str) -> datetime | None:
        with contextlib.suppress(APIError):  # priming only; the probe below is what counts
            self.client.run(deployment, input=SYNC_INPUT)
        old = self.pid()
        fault_at = utcnow()
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (new := self.pid()) == old or not alive(new):
            assert time.monotonic() < deadline, "the supervisor did not restart redis-server"
            time.sleep(0.05)
        self.probes.append(self.probe(deployment))
        return fault_at

    def probe(self, deployment: str) -> str:
        try:
            self.client.run(deployment, input=SYNC_INPUT)
        except APIError as e:
            return f"HTTP {e.status} (job id {'given' if e.job_id else 'not given'})"
        return "ok"


@pytest.fixture(scope="module")
def killer(fault_platform: dict[str, Any]) -> Iterator[RedisKiller]:
    with RedisKiller(fault_platform) as k:
        yield k


@pytest.fixture(scope="module")
def run(fault_platform: dict[str, Any], fault_model: Path, killer: RedisKiller) -> FaultRun:
    return run_scenario(
        "redis_restarts", fault_platform, fault_model, SIZES, SIZES.redis_restarts, killer
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_after_redis_restarts(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_every_restart_was_injected_and_recovered(run: FaultRun) -> None:
    assert run.faults == SIZES.redis_restarts
    assert run.unrecovered == 0, "no job succeeded after a restart"


def test_sync_calls_answer_right_after_a_restart(run: FaultRun, killer: RedisKiller) -> None:
    if not killer.probes:
        pytest.skip("no restart was injected (FAULTS_REDIS_RESTARTS=0)")
    print(f"sync call right after each restart: {killer.probes}")
    assert set(killer.probes) == {"ok"}


def test_no_worker_fails_on_a_broker_restart(run: FaultRun, fault_platform: dict[str, Any]) -> None:
    """Workers re-open their broker connection: a Redis restart costs no warm worker (of this
    scenario's deployment: the other scenarios on this platform kill workers on purpose)."""
    ledger = Ledger(fault_platform["database_url"])
    try:
        assert ledger.worker_failures("faults-redis-restarts") == []
    finally:
        ledger.close()

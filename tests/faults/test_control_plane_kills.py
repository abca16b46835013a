"""The control plane's own processes killed with SIGKILL while async jobs (with webhooks) are
submitted and run: the API, the Celery worker and the reconciler in turn. The supervisor starts
each again; the API may refuse connections meanwhile (not admitted), a killed Celery worker
leaves a webhook delivery unacknowledged, and a killed reconciler takes the workers it started
with it (they die with their parent). Nothing admitted may be lost, doubled or billed twice:
the one checker (invariants/) runs over the ledger, Redis and the webhook receiver's log.

Sizes: FAULTS_JOBS (12), FAULTS_CONTROL_PLANE_KILLS (3); `make faults` runs the long form.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import alive
from tests.faults.harness import (
    INVARIANTS,
    SIZES,
    FaultRun,
    Injector,
    probe,
    run_scenario,
    scenario_marks,
    utcnow,
)
from tests.faults.invariants import assert_holds
from tests.faults.ledger import Ledger

VICTIMS = ("api", "celery", "reconciler")

pytestmark = scenario_marks()


class ControlPlaneKiller(Injector):
    """The fault: SIGKILL the next of VICTIMS; return once the supervisor has started it again
    and a sync call (the probe) went through.

    The probe is a job picked up after the fault by construction: the submitter's last jobs
    may all be running already when the last fault strikes, and a recovery is measured to the
    first job picked up after it.
    """

    def __init__(self, platform: dict[str, Any]) -> None:
        super().__init__(platform, timeout_s=120)
        self.state_dir: Path = platform["state_dir"]
        self.url: str = platform["url"]
        self.killed: Counter[str] = Counter()

    def pid(self, name: str) -> int:
        """The supervisor's current pid of `name` (platform.json is rewritten on restarts)."""
        children = json.loads((self.state_dir / "platform.json").read_text())["children"]
        return int(children[name])

    def __call__(self, _ledger: Ledger, deployment: str) -> datetime | None:
        name = VICTIMS[sum(self.killed.values()) % len(VICTIMS)]
        old = self.pid(name)
        fault_at = utcnow()
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (new := self.pid(name)) == old or not alive(new):
            assert time.monotonic() < deadline, f"the supervisor did not restart {name}"
            time.sleep(0.05)
        self.killed[name] += 1
        while not self.serving():
            assert time.monotonic() < deadline, "the API did not come back"
            time.sleep(0.1)
        self.probes.append(probe(self.client, deployment, name))
        return fault_at

    def serving(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def killer(fault_platform: dict[str, Any]) -> Iterator[ControlPlaneKiller]:
    with ControlPlaneKiller(fault_platform) as k:
        yield k


@pytest.fixture(scope="module")
def run(fault_platform: dict[str, Any], fault_model: Path, killer: ControlPlaneKiller) -> FaultRun:
    return run_scenario(
        "control_plane_kills",
        fault_platform,
        fault_model,
        SIZES,
        SIZES.control_plane_kills,
        killer,
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_after_control_plane_kills(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_every_kill_was_injected_and_recovered(run: FaultRun, killer: ControlPlaneKiller) -> None:
    assert run.faults == SIZES.control_plane_kills
    if SIZES.control_plane_kills >= len(VICTIMS):
        assert set(killer.killed) == set(VICTIMS), killer.killed
    assert run.unrecovered == 0, "no job succeeded after a kill"
    assert set(killer.probes) == {"ok"}, killer.probes

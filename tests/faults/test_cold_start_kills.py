"""Workers killed with SIGKILL in the middle of their cold start, alternately while loading
their weights and while warming up, again and again, while async jobs keep arriving: the
reconciler reaps each dead worker, bills its start-up phases up to its death and starts
another. Then the one checker (invariants/) runs over the ledger, Redis and the webhooks.

A kill needs a worker in its cold start, so each fault makes one: it kills a serving worker
(preferably one with no job), watches the workers table every POLL_S for the replacement to
enter the phase under test, and kills it there. The deployment keeps two workers
(min_workers=max_workers=2), each holding up to four jobs: the survivor takes every waiting
job, so the replacement finds the queue empty and warms up (a worker that finds jobs waiting
skips the warm-up, see worker/runtime/lifecycle.py). The model is a bigger random Llama
(slow_model.py): the demo model's phases last tens of milliseconds, too short to be caught.

After a kill in the phase a sync call (the probe) must go through: the scenario's own jobs may
all have ended by then, and recovery is measured to the first job picked up after the fault.

A kill that the replacement outran (it was past the phase when the SIGKILL landed, as its
billing shows) is tried again, at most MAX_TRIES times a fault: only kills in the phase count.
Each fault lets the replacement of its victim serve before the next one, so the crash-loop
policy (three failed boots in a row fail the waiting jobs) is never what is under test.

Sizes: FAULTS_JOBS (12), FAULTS_COLD_START_KILLS (2); `make faults` runs the long form.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

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
from tests.faults.slow_model import build_slow_model
from tests.faults.test_worker_kills import is_worker

pytestmark = scenario_marks()

# The phases killed in, in turn (worker states), and the billing phase each one is billed as.
PHASES = ("loading", "warming")
BILLED_AS = {"loading": "load", "warming": "warm"}
SERVING = frozenset({"idle", "busy"})
# How often the workers table is read while a replacement starts (its warm-up lasts ~50 ms).
POLL_S = 0.01
# Kills that missed their phase before a fault gives up (None: injected fewer).
MAX_TRIES = 4
WORKERS = 2  # the deployment's min_workers = max_workers
START_TIMEOUT_S = 120.0  # a replacement serves, or reaches the phase, within this


@dataclass(frozen=True, slots=True)
class Victim:
    """A worker killed in its cold start, as the ledger tells its end."""

    worker_id: str
    target: str  # the worker state it was found in: loading or warming
    state: str  # its state once reaped (failed)
    reason: str | None  # why it ended (exit_-9: the process was reaped)
    phase: str | None  # its last billing record's phase: load or warm when the kill landed

    @property
    def hit(self) -> bool:
        return self.phase == BILLED_AS[self.target]


class ColdStartKiller(Injector):
    """The fault: SIGKILL a worker while it loads (even faults) or warms up (odd faults);
    `victims` are all the workers it killed in a cold start, misses included."""

    def __init__(self, platform: dict[str, Any]) -> None:
        super().__init__(platform, timeout_s=120)
        self.victims: list[Victim] = []
        self.injected = 0
        self.triggers = 0  # serving workers killed to cause a cold start

    def __call__(self, ledger: Ledger, deployment: str) -> datetime | None:
        target = PHASES[self.injected % len(PHASES)]
        for _ in range(MAX_TRIES):
            if not self._kill_a_serving_worker(ledger, deployment):
                return None
            known = {w for w, _, _ in ledger.workers(deployment)}
            found = self._kill_replacement_in(ledger, deployment, known, target)
            if found is None:
                continue  # it went past the phase unseen (a warm-up skipped for waiting jobs)
            victim_id, fault_at = found
            victim = self._reaped(ledger, victim_id, target)
            self.victims.append(victim)
            if victim.hit:
                self.injected += 1
                self.probes.append(probe(self.client, deployment, target))
                return fault_at
        return None

    def _kill_a_serving_worker(self, ledger: Ledger, deployment: str) -> bool:
        """Once WORKERS workers serve (the last victim's replacement among them), kill one,
        one without a running job when there is one: a cold start follows."""
        busy = {w for _, _, w, _ in ledger.running(deployment)}
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            serving = [
                (w, pid)
                for w, state, pid in ledger.workers(deployment)
                if state in SERVING and pid and is_worker(pid, w)
            ]
            if len(serving) >= WORKERS:
                serving.sort(key=lambda wp: wp[0] in busy)
                os.kill(serving[0][1], signal.SIGKILL)
                self.triggers += 1
                return True
            time.sleep(0.1)
            busy = {w for _, _, w, _ in ledger.running(deployment)}
        return False

    def _kill_replacement_in(
        self, ledger: Ledger, deployment: str, known: set[str], target: str
    ) -> tuple[str, datetime] | None:
        """SIGKILL the first new worker seen in `target` state: (its id, when); None when a
        new worker reached serving without being seen there."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for w, state, pid in ledger.workers(deployment):
                if w in known:
                    continue
                if state == target and pid and is_worker(pid, w):
                    fault_at = utcnow()
                    os.kill(pid, signal.SIGKILL)
                    return w, fault_at
                if state in SERVING:
                    return None
            time.sleep(POLL_S)
        return None

    @staticmethod
    def _reaped(ledger: Ledger, worker_id: str, target: str) -> Victim:
        """The victim once the reconciler has reaped it (its row still says otherwise after
        START_TIMEOUT_S: a worker never reaped, which the test reports)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            state, reason, phase = ledger.last_phase(worker_id)
            if state in ("failed", "stopped") or time.monotonic() > deadline:
                return Victim(worker_id, target, state, reason, phase)
            time.sleep(0.1)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_slow_model(tmp_path_factory.mktemp("slow-model") / "slow")


@pytest.fixture(scope="module")
def killer(fault_platform: dict[str, Any]) -> Iterator[ColdStartKiller]:
    with ColdStartKiller(fault_platform) as k:
        yield k


@pytest.fixture(scope="module")
def run(
    fault_platform: dict[str, Any], slow_model: Path, killer: ColdStartKiller
) -> Iterator[FaultRun]:
    try:
        run = run_scenario(
            "cold_start_kills",
            fault_platform,
            slow_model,
            SIZES,
            SIZES.cold_start_kills,
            killer,
            min_workers=WORKERS,
            max_workers=WORKERS,
            target_concurrency=4,
        )
        kills = Counter((v.target, v.hit) for v in killer.victims)
        print(f"cold-start kills (state, in phase): {dict(kills)}; {killer.triggers} serving")
        yield run
    finally:
        # its two workers hold the big model: they go before the session's next scenarios
        killer.client.deployments.delete("faults-cold-start-kills")


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_after_cold_start_kills(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_every_kill_was_injected_and_recovered(run: FaultRun, killer: ColdStartKiller) -> None:
    assert run.faults == SIZES.cold_start_kills, f"kills that missed: {killer.victims}"
    assert run.unrecovered == 0, "no job succeeded after a kill"
    assert set(killer.probes) == {"ok"}, killer.probes
    hits = Counter(v.target for v in killer.victims if v.hit)
    # loading, warming, loading, ...: each phase got its share of the kills
    assert hits == Counter(PHASES[k % len(PHASES)] for k in range(run.faults)), hits


def test_every_killed_worker_was_reaped(run: FaultRun, killer: ColdStartKiller) -> None:
    """Each victim ended `failed` as a process that exited on SIGKILL (the reaper's verdict):
    none left `loading` or `warming`, none failed later for a lost heartbeat instead."""
    assert killer.victims, "nothing was killed"
    for v in killer.victims:
        assert (v.state, v.reason) == ("failed", f"exit_{-signal.SIGKILL}"), v

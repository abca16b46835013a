"""A webhook receiver that misbehaves: while async jobs (each with a webhook) flow, every
`job.completed` message is refused at its first attempt — a 500, a connection reset, an
answer slower than the platform's webhook timeout, or a redirect (never followed) — and half
of them at their second too; later attempts get a 200. Every message must still arrive under
one `webhook-id`, every attempt signed, and nothing else may suffer: the one checker
(invariants/) runs over the ledger, Redis and the receiver's log, where an attempt counts as
arrived only if the receiver answered it 2xx.

A 410 is not among the faults: it disables the tenant's endpoint by design (later messages to
it are not sent), which tests/integration/webhooks/test_delivery.py covers.

Sizes: FAULTS_JOBS (12); `make faults` runs the long form.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import INVARIANTS, SIZES, FaultRun, run_scenario, scenario_marks
from tests.faults.invariants import assert_holds

FAULTS = ("500", "reset", "slow", "redirect")

pytestmark = scenario_marks()


class Misbehaving:
    """The receiver's plan: the k-th `job.completed` message it sees gets FAULTS[k % 4] at its
    first attempt and, for every other k, at its second too; a 200 after."""

    def __init__(self) -> None:
        self.order: dict[str, int] = {}  # message id -> k
        self.done: Counter[str] = Counter()  # faults played, by kind
        self._lock = threading.Lock()  # the receiver calls it from its handlers' threads

    def __call__(self, msg_id: str, nth: int) -> str:
        if not msg_id.endswith("_completed"):
            return "ok"
        with self._lock:
            k = self.order.setdefault(msg_id, len(self.order))
            if nth > 2 or (nth == 2 and k % 2):
                return "ok"
            fault = FAULTS[k % len(FAULTS)]
            self.done[fault] += 1
            return fault


@pytest.fixture(scope="module")
def plan() -> Misbehaving:
    return Misbehaving()


@pytest.fixture(scope="module")
def run(fault_platform: dict[str, Any], fault_model: Path, plan: Misbehaving) -> FaultRun:
    return run_scenario(
        "webhook_receiver_faults",
        fault_platform,
        fault_model,
        SIZES,
        0,  # the faults are the receiver's, at every message: nothing to inject
        lambda *_: None,
        receiver_plan=plan,
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_with_a_misbehaving_receiver(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_every_message_was_refused_before_it_got_through(run: FaultRun, plan: Misbehaving) -> None:
    assert run.admitted == SIZES.jobs
    assert sum(plan.done.values()) >= run.admitted  # at least its first attempt, each
    if SIZES.jobs >= len(FAULTS):
        assert set(plan.done) == set(FAULTS), plan.done  # every kind was played

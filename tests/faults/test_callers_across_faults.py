"""Sync calls and streams in flight across faults: before each fault, one caller of each kind
(tests/faults/callers.py: the SDK's sync `run`, a plain SSE client, the SDK's `Stream`, the
`openai` client's stream) starts a job long enough to be running when it strikes; the faults
are, in turn, a SIGKILL of the worker running one of those jobs, of redis-server, of every API
process, and of the Celery worker (the supervisor restarts each). Every caller must end within
its bound with its job's exact output, or with an explicit error naming its job (a plain SSE
or OpenAI client whose connection the API's death cut knows it from `X-Job-Id`): never a
hang, never another text (attempts mixed, deltas lost). Async jobs with webhooks flow
meanwhile, and the one checker (invariants/) runs over all of it, the callers' jobs included.

Sizes: FAULTS_JOBS (12), FAULTS_CALLER_FAULTS (4: each kind once); `make faults` runs the
long form.
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
from tests.faults.callers import CALL_TIMEOUT_S, KINDS, Caller, Outcome, judge
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

FAULTS = ("worker", "redis", "api", "celery")
# Tokens per caller's job: long enough (~1-3 s on 2 cores) to be running when its fault strikes.
CALLER_TOKENS = 16 * SIZES.max_tokens

pytestmark = scenario_marks()


class CallerFaults(Injector):
    """A fault (the next of FAULTS) with a caller of each kind in flight across it; `outcomes`:
    per fault, each caller's."""

    def __init__(self, platform: dict[str, Any]) -> None:
        super().__init__(platform, timeout_s=120)
        self.platform = platform
        self.state_dir: Path = platform["state_dir"]
        self.done: Counter[str] = Counter()
        self.outcomes: list[tuple[str, Outcome, str | None]] = []  # (fault, outcome, job id)

    def children(self) -> dict[str, int]:
        """The supervisor's current pids (platform.json is rewritten on restarts)."""
        doc = json.loads((self.state_dir / "platform.json").read_text())
        return {name: int(pid) for name, pid in doc["children"].items()}

    def __call__(self, ledger: Ledger, deployment: str) -> datetime | None:
        fault = FAULTS[sum(self.done.values()) % len(FAULTS)]
        since = utcnow()
        n = sum(self.done.values())
        callers = [
            Caller(self.platform, deployment, kind, f"The river {n} {kind}", CALLER_TOKENS)
            for kind in KINDS
        ]
        for c in callers:
            c.start()
        victim = self._in_flight(ledger, deployment, since, {c.outcome.prompt for c in callers})
        fault_at = utcnow()
        if victim is not None:
            self._strike(fault, victim)
        self.done[fault] += 1
        for c in callers:
            c.join(CALL_TIMEOUT_S + 30)
        jobs = ledger.prompts_since(deployment, since)
        for c in callers:
            self.outcomes.append((fault, c.outcome, jobs.get(c.outcome.prompt)))
        if victim is None:
            return None
        # a job picked up after the fault, which recovery is measured to (the callers' and the
        # submitter's may all have started before it)
        self.probes.append(probe(self.client, deployment, fault))
        return fault_at

    def _in_flight(
        self, ledger: Ledger, deployment: str, since: datetime, prompts: set[str]
    ) -> int | None:
        """Once every caller's job exists and one runs: the pid of a worker running one of
        them (None: none ran within 60 s)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = ledger.prompts_since(deployment, since)
            ours = {jobs[p] for p in prompts if p in jobs}
            running = [pid for j, _, _, pid in ledger.running(deployment) if j in ours]
            if len(ours) == len(prompts) and running:
                time.sleep(0.3)  # into their text
                return running[0]
            time.sleep(0.02)
        return None

    def _strike(self, fault: str, worker_pid: int) -> None:
        if fault == "worker":
            os.kill(worker_pid, signal.SIGKILL)
            return
        names = [n for n in self.children() if n.startswith(fault)]  # every API process
        old = {n: self.children()[n] for n in names}
        for pid in old.values():
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        for name, pid in old.items():
            while (new := self.children()[name]) == pid or not alive(new):
                assert time.monotonic() < deadline, f"the supervisor did not restart {name}"
                time.sleep(0.05)
        while not self._serving():
            assert time.monotonic() < deadline, "the API did not come back"
            time.sleep(0.1)

    def _serving(self) -> bool:
        try:
            return httpx.get(self.platform["url"] + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def jobs(self) -> list[str]:
        return [job for _, _, job in self.outcomes if job is not None]


@pytest.fixture(scope="module")
def faults(fault_platform: dict[str, Any]) -> Iterator[CallerFaults]:
    with CallerFaults(fault_platform) as f:
        yield f


@pytest.fixture(scope="module")
def run(fault_platform: dict[str, Any], fault_model: Path, faults: CallerFaults) -> FaultRun:
    return run_scenario(
        "callers_across_faults",
        fault_platform,
        fault_model,
        SIZES,
        SIZES.caller_faults,
        faults,
        fault_jobs=faults.jobs,
        min_workers=1,
        target_concurrency=8,
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_with_callers_across_faults(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_every_fault_struck_callers_in_flight(run: FaultRun, faults: CallerFaults) -> None:
    assert run.faults == SIZES.caller_faults, "a fault found none of its callers' jobs running"
    if SIZES.caller_faults >= len(FAULTS):
        assert set(faults.done) == set(FAULTS), faults.done
    assert run.unrecovered == 0, "no job succeeded after a fault"
    assert set(faults.probes) == {"ok"}, faults.probes


def test_every_caller_got_its_jobs_output_or_an_error_naming_its_job(
    run: FaultRun, faults: CallerFaults, fault_platform: dict[str, Any]
) -> None:
    ledger = Ledger(fault_platform["database_url"])
    try:
        verdicts = []
        for fault, outcome, job_id in faults.outcomes:
            status, output = ledger.job(job_id) if job_id else (None, None)
            verdicts.append((fault, outcome.kind, judge(outcome, job_id, status, output)))
    finally:
        ledger.close()
    exact = sum(1 for _, o, _ in faults.outcomes if o.text is not None and o.error is None)
    seconds = [o.seconds for _, o, _ in faults.outcomes if o.seconds is not None]
    print(
        f"callers: {len(verdicts)}, exact output {exact}, explicit errors {len(verdicts) - exact}"
        f", slowest {max(seconds, default=0):.1f} s; "
        f"errors {[(f, o.kind, o.error) for f, o, _ in faults.outcomes if o.error]}"
    )
    wrong = [v for v in verdicts if v[2] != "ok"]
    assert wrong == [], wrong
    assert len(verdicts) == len(KINDS) * SIZES.caller_faults

"""Every job's wake-up delivered more than once, to two workers racing for the same queue:
while async jobs (with webhooks) flow through a deployment held at two warm workers, each
fault sends two more wake-ups for every job not ended yet (a broker's redelivery, a
reconciler's redispatch racing the first). Claims are fenced: one worker gets each attempt,
the other's claim is refused. Nothing may run twice to a second accepted result, be billed
twice or leave a message unacknowledged: the one checker (invariants/) runs over the
ledger, Redis and the webhook receiver's log.

Sizes: FAULTS_JOBS (12), FAULTS_DUPLICATIONS (4); `make faults` runs the long form.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from control_plane.services.jobs.dispatch import dispatch_job
from tests.faults.harness import (
    INVARIANTS,
    SIZES,
    FaultRun,
    Injector,
    probe,
    run_scenario,
    scenario_marks,
    submit_long_job,
    utcnow,
)
from tests.faults.invariants import assert_holds
from tests.faults.ledger import Ledger

DUPLICATIONS = int(os.environ.get("FAULTS_DUPLICATIONS", "4"))
COPIES = 2  # more wake-ups per unfinished job, per fault
DEPLOYMENT = "faults-duplicate-deliveries"  # what run_scenario names "duplicate_deliveries"

pytestmark = scenario_marks(SIZES.timeout_s() + 60 * DUPLICATIONS)


class Duplicator(Injector):
    """The fault: COPIES more wake-ups for every job of the deployment not ended yet. When the
    submitted jobs have all ended before the fault's turn (a fast machine, or a slow one that
    fell behind), it submits a longer job of its own and duplicates that one's."""

    def __init__(self, platform: dict[str, Any]) -> None:
        super().__init__(platform)
        self.redis = redis.Redis.from_url(platform["redis_url"])
        self.sent = 0  # duplicate wake-ups sent, over the run
        self.jobs: set[str] = set()  # jobs that got some

    def __call__(self, ledger: Ledger, deployment: str) -> datetime | None:
        unfinished = ledger.unfinished_of(deployment)
        if not unfinished:
            submit_long_job(self.client, deployment, SIZES)
            unfinished = ledger.unfinished_of(deployment)
        if not unfinished:
            return None
        fault_at = utcnow()
        for job_id, deployment_id, kind in unfinished:
            for _ in range(COPIES):
                dispatch_job(self.redis, deployment_id, job_id, kind)
                self.sent += 1
            self.jobs.add(job_id)
        # the scenario's own jobs may all have been picked up already: recovery is measured to
        # a job picked up after the fault
        self.probes.append(probe(self.client, deployment, "duplication"))
        return fault_at

    def close(self) -> None:
        self.redis.close()
        super().close()


@pytest.fixture(scope="module")
def duplicator(fault_platform: dict[str, Any]) -> Iterator[Duplicator]:
    with Duplicator(fault_platform) as d:
        yield d


@pytest.fixture(scope="module")
def run(fault_platform: dict[str, Any], fault_model: Path, duplicator: Duplicator) -> FaultRun:
    return run_scenario(
        "duplicate_deliveries",
        fault_platform,
        fault_model,
        SIZES,
        DUPLICATIONS,
        duplicator,
        min_workers=2,  # two workers consume the deployment's queue: they race for each copy
        max_workers=2,
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_after_duplicate_deliveries(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_duplicates_were_sent_and_every_job_ran_once(
    run: FaultRun, duplicator: Duplicator, fault_platform: dict[str, Any]
) -> None:
    assert run.faults == DUPLICATIONS, "a fault found no unfinished job to duplicate"
    assert duplicator.sent >= COPIES * DUPLICATIONS
    assert run.unrecovered == 0
    assert set(duplicator.probes) == {"ok"}, duplicator.probes
    assert run.statuses == {"succeeded": run.admitted}, run.statuses
    ledger = Ledger(fault_platform["database_url"])
    try:
        # a refused claim costs no worker
        assert ledger.worker_failures(DEPLOYMENT) == []
    finally:
        ledger.close()
    # and the race did happen: the workers' own logs name the copies they were refused
    refused = 0
    for path in (Path(fault_platform["state_dir"]) / "logs" / "workers").glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if "not claimable" in line and json.loads(line).get("job_id") in duplicator.jobs:
                refused += 1
    assert refused > 0, "no worker was refused a duplicate's claim"

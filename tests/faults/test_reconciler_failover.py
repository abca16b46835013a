"""Two reconciler replicas (`platform up --reconcilers 2`); the leader is made to fail while
async jobs (with webhooks) run, in turn:
- paused (SIGSTOP): it stops renewing the lease, so the standby must take over within 15 s with
  the default lease (10 s); the old leader is then resumed (SIGCONT) and must act no more: it
  finds a newer fencing token or a lease that is not its own, and only steps down;
- killed (SIGKILL): its workers die with it; a replica (the supervisor restarts the killed one
  under its own name, or the standby) takes a new token within 15 s and requeues their jobs.
Nothing admitted may be lost, doubled or billed twice (invariants/).

Sizes: FAULTS_JOBS (12), FAULTS_FAILOVERS (2); `make faults` runs the long form.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from common.protocol import RECONCILER_LEASE_KEY
from control_plane.db.models import ReconcilerFence
from tests.e2e.conftest import embedded_platform, processes_mentioning
from tests.faults.harness import (
    INVARIANTS,
    SIZES,
    FaultRun,
    Injector,
    log_after,
    probe,
    run_scenario,
    scenario_marks,
    utcnow,
    wait_for_log,
)
from tests.faults.invariants import assert_holds
from tests.faults.ledger import Ledger

FAILOVERS = int(os.environ.get("FAULTS_FAILOVERS", "2"))
# The bound on a failover, with the default lease (PLATFORM_RECONCILER_LEASE_S=10).
FAILOVER_BOUND_S = 15.0
STARTED = re.compile(r"started worker (wrk_[0-9A-Za-z]+)")

pytestmark = scenario_marks()


class LeaderFault(Injector):
    """Pauses, then kills, the leading reconciler in turn; records how long until another
    token was taken, and what a paused leader wrote to its log once resumed."""

    def __init__(self, platform: dict[str, Any]) -> None:
        super().__init__(platform, timeout_s=120)
        self.state_dir: Path = platform["state_dir"]
        self.redis = redis.Redis.from_url(platform["redis_url"])
        self.ledger = Ledger(platform["database_url"])
        self.failovers: list[tuple[str, float]] = []  # (fault, seconds to a new token)
        self.resumed_logs: list[str] = []  # a paused leader's log lines after its resume

    def close(self) -> None:
        self.redis.close()
        self.ledger.close()
        super().close()

    def leader(self) -> tuple[str, int]:
        holder = self.redis.get(RECONCILER_LEASE_KEY)
        assert holder is not None, "no reconciler holds the lease"
        name = holder.decode()
        children = json.loads((self.state_dir / "platform.json").read_text())["children"]
        return name, int(children[name])

    def token(self) -> tuple[int, str | None]:
        with self.ledger._sessions() as s:
            row = s.execute(select(ReconcilerFence.token, ReconcilerFence.holder)).one()
            return row[0], row[1]

    def __call__(self, _ledger: Ledger, deployment: str) -> datetime | None:
        kind = ("pause", "kill")[len(self.failovers) % 2]
        name, pid = self.leader()
        before, _ = self.token()
        log = self.state_dir / "logs" / f"{name}.log"
        size = log.stat().st_size
        fault_at, started = utcnow(), time.monotonic()
        os.kill(pid, signal.SIGSTOP if kind == "pause" else signal.SIGKILL)
        deadline = started + 60
        while self.token()[0] == before:
            assert time.monotonic() < deadline, f"no replica took over after the {kind}"
            time.sleep(0.1)
        self.failovers.append((kind, time.monotonic() - started))
        if kind == "pause":
            self._resume(log, size, pid)
        else:  # the next fault's standby: running again, as the bound supposes
            wait_for_log(log, size, f"reconciler {name} running", timeout_s=60)
        self.probes.append(probe(self.client, deployment, kind))
        return fault_at

    def _resume(self, log: Path, size: int, pid: int) -> None:
        os.kill(pid, signal.SIGCONT)
        wait_for_log(log, size, "stopped leading", timeout_s=20)
        time.sleep(1.0)  # what it does next, too
        self.resumed_logs.append(log_after(log, size))


@pytest.fixture(scope="module")
def failover_platform(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> Iterator[dict[str, Any]]:
    """On PostgreSQL, as replicas run at scale: it ends the open transaction of a paused
    leader (idle_in_transaction_session_timeout), where a paused SQLite writer would hold the
    database's one write lock for as long as it stays paused."""
    from tests.fixtures_postgres import fresh_database

    for database_url in fresh_database(postgres_url):
        yield from _platform(tmp_path_factory, database_url)


def _platform(
    tmp_path_factory: pytest.TempPathFactory, database_url: str
) -> Iterator[dict[str, Any]]:
    extra = {
        "PLATFORM_DATABASE_URL": database_url,
        "PLATFORM_RECONCILERS": "2",
        "PLATFORM_DEFAULT_REQUESTS_PER_MIN": "1000000",
        "PLATFORM_WEBHOOK_RETRY_SCHEDULE_S": "[0.5, 1, 2, 4, 8, 16]",
        "PLATFORM_WEBHOOK_TIMEOUT_S": "2",
        "PLATFORM_LOG_FORMAT": "text",  # read by this test, line by line
    }
    with embedded_platform(tmp_path_factory.mktemp("failover-platform"), extra) as state:
        yield state


@pytest.fixture(scope="module")
def fault(failover_platform: dict[str, Any]) -> Iterator[LeaderFault]:
    with LeaderFault(failover_platform) as f:
        yield f


@pytest.fixture(scope="module")
def run(failover_platform: dict[str, Any], fault_model: Path, fault: LeaderFault) -> FaultRun:
    return run_scenario(
        "reconciler_failover", failover_platform, fault_model, SIZES, FAILOVERS, fault
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_across_failovers(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_each_failover_took_at_most_15_s(run: FaultRun, fault: LeaderFault) -> None:
    assert run.faults == FAILOVERS
    assert len(fault.failovers) == FAILOVERS
    slow = [(kind, round(s, 1)) for kind, s in fault.failovers if s > FAILOVER_BOUND_S]
    assert slow == [], fault.failovers
    assert run.unrecovered == 0, "no job succeeded after a failover"
    assert set(fault.probes) == {"ok"}, fault.probes


def test_a_resumed_leader_only_steps_down(run: FaultRun, fault: LeaderFault) -> None:
    assert fault.resumed_logs, "no pause was injected"
    for lines in fault.resumed_logs:
        assert "stopped leading" in lines
        for action in ("requeued", "leading as"):
            assert action not in lines, f"a deposed leader acted ({action!r}):\n{lines}"
    # A worker start the leader was inside when it was paused (its row flushed, its process
    # being spawned) may finish on resume: nothing begun after the resume can start one (its
    # transaction's fence check fails first), and what the paused one started leaves nothing:
    # its row never committed (PostgreSQL ended that transaction), and a worker whose row is
    # missing exits at its first state report.
    started = {w for lines in fault.resumed_logs for w in STARTED.findall(lines)}
    for worker_id in started:
        assert not fault.ledger.has_worker(worker_id), f"a deposed leader's {worker_id} has a row"
    deadline = time.monotonic() + 60
    while left := [p for w in started for p in processes_mentioning(w) if "-m worker" in p]:
        assert time.monotonic() < deadline, f"a deposed leader's worker runs on: {left}"
        time.sleep(0.5)

"""A worker's busy and idle phases (SQLite and PostgreSQL): set by claims and by the loop after
its jobs end (not by the worker's reports), as of its last job's end, and kept busy when a claim
commits while a tick settles it."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from common.protocol import worker_heartbeat_key
from control_plane.db.models import JobAttempt, Worker
from control_plane.providers.base import Exited
from control_plane.reconcile.driver import Reconciler
from control_plane.services.workers import worker_records
from tests.integration.api_helpers import WORKER, h
from tests.integration.billing_helpers import claim, complete, records, start_worker, submit
from tests.integration.conftest import SteppedClock, provider


def test_a_worker_that_gets_a_job_while_the_tick_settles_it_stays_busy(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    clock: SteppedClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tick reads which busy workers hold no running job, then writes; a claim that
    commits between the two keeps its worker busy (the tick reads again under its lock)."""
    key = keys["a"]
    wid = start_worker(client, clock, key, loop, target_concurrency=2)
    first = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    claim(client, first, wid)  # busy, with a running job
    real = worker_records._without_running_jobs
    reads: list[list[str]] = []

    def first_read_before_the_claim(session: Any, worker_ids: list[str]) -> list[str]:
        reads.append(list(worker_ids))
        return list(worker_ids) if len(reads) == 1 else real(session, worker_ids)

    monkeypatch.setattr(worker_records, "_without_running_jobs", first_read_before_the_claim)
    clock.advance(0.3)
    loop.tick(clock())
    assert wid in reads[0] and len(reads) == 2
    data = client.get("/v1/workers", headers=h(key)).json()["data"]
    assert next(w["state"] for w in data if w["id"] == wid) == "busy"


def test_busy_and_idle_follow_the_claims_and_job_ends(
    client: TestClient, keys: dict[str, str], loop: Reconciler, clock: SteppedClock
) -> None:
    """The worker reports neither: a claim makes an idle worker busy; the reconciler's next
    tick makes a busy worker none of whose jobs runs idle again, as of its last job's end (a
    job ended by a cancel, whose report is fenced off, included)."""
    key = keys["a"]
    wid = start_worker(client, clock, key, loop, target_concurrency=2)

    def state() -> str:
        data = client.get("/v1/workers", headers=h(key)).json()["data"]
        return str(next(w["state"] for w in data if w["id"] == wid))

    first = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    second = submit(client, key)
    clock.advance(0.2)
    a1 = claim(client, first, wid)
    assert state() == "busy"
    a2 = claim(client, second, wid)
    clock.advance(0.3)
    complete(client, first, wid, a1, prompt=1, gen=1)
    loop.tick(clock())
    assert state() == "busy", "the second job still runs"
    clock.advance(0.1)
    complete(client, second, wid, a2, prompt=1, gen=1)
    last_end = client.get(f"/v1/jobs/{second}", headers=h(key)).json()["completed_at"]
    assert state() == "busy", "a job's end writes nothing to its worker"
    clock.advance(0.4)
    loop.tick(clock())
    assert state() == "idle"
    third = submit(client, key)
    a3 = claim(client, third, wid)
    assert client.post(f"/v1/jobs/{third}/cancel", headers=h(key)).status_code == 200
    body = {"worker_id": wid, "attempt": a3, "status": "canceled"}
    r = client.post(f"/internal/jobs/{third}/complete", json=body, headers=WORKER)
    assert r.status_code == 409, "fenced off"
    clock.advance(0.2)
    loop.tick(clock())
    assert state() == "idle", "idle all the same"
    recs = records(client, key, worker_id=wid)
    # (the idle phase it is in now is still open: not a record yet)
    assert [r["phase"] for r in recs] == ["boot", "load", "warm", "idle", "busy", "idle", "busy"]
    busy = recs[4]
    assert busy["end"] == last_end, "idle from the last job's end, not from the tick"


def test_a_killed_workers_life_ends_at_its_last_sign_of_life_not_at_the_reap(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
) -> None:
    """A worker whose process is killed (SIGKILL: exit -9) is found by the reaper a tick or
    more later; its open segment and its life end at its last sign of life (docs/billing.md):
    its last heartbeat, or a job it reported after that beat (billed in its segment), and
    its running attempt ends there too (unbilled). A clean exit ends at the reap."""
    key = keys["a"]
    wid = start_worker(client, clock, key, loop, target_concurrency=2)
    first = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    second = submit(client, key)
    a1 = claim(client, first, wid)
    claim(client, second, wid)
    clock.advance(0.5)
    beat = clock()
    redis_client.set(worker_heartbeat_key(wid), json.dumps({"at": beat.timestamp()}), ex=10)
    loop.tick(clock())  # records the heartbeat
    clock.advance(1.0)
    complete(client, first, wid, a1, prompt=1, gen=1)  # reported between two beats
    reported = datetime.fromisoformat(
        client.get(f"/v1/jobs/{first}", headers=h(key)).json()["completed_at"]
    )
    assert reported > beat
    clock.advance(3.0)  # killed meanwhile; the reaper sees it now
    provider(loop).exits.append(Exited(wid, -9))
    loop.tick(clock())
    recs = records(client, key, worker_id=wid)
    assert (recs[-1]["phase"], recs[-1]["note"]) == ("busy", "heartbeat")
    assert datetime.fromisoformat(recs[-1]["end"]) == reported, "not the reap, not the beat"
    with loop.sessions() as s:
        w = s.get(Worker, wid)
        assert w is not None and (w.state, w.reason) == ("failed", "exit_-9")
        assert w.stopped_at == reported
        lost = s.scalars(
            select(JobAttempt).where(JobAttempt.job_id == second, JobAttempt.attempt == 1)
        ).one()
        assert lost.ended_at == reported, "the lost attempt ends with its worker"
    loop.tick(clock())  # allocates the closed busy record
    usage = {u["job_id"]: u for u in client.get("/v1/usage", headers=h(key)).json()["data"]}
    assert Decimal(usage[first]["cost"]) > 0, "the job it reported is billed"
    assert client.get("/v1/billing/check", headers=h(key)).json() == {"ok": True, "issues": []}

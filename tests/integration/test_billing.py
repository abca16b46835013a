"""Billing end to end through the API and the loop, on real Redis and SQL (SQLite and
PostgreSQL): phase records tiling a worker's life, exact job cost shares (however many ways a
busy segment splits, and only among the jobs it served), what is not billed (a boot past
max_boot_s, a lost worker's attempt), and long phases closed every minute."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient

from common.protocol import worker_heartbeat_key
from control_plane.db.models import Worker
from control_plane.reconcile.driver import Reconciler
from tests.integration.api_helpers import deploy, h
from tests.integration.billing_helpers import claim, complete, records, report, start_worker, submit
from tests.integration.conftest import SteppedClock, provider


def test_overlapping_jobs_split_busy_cost_by_tokens_exactly(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
) -> None:
    key = keys["a"]
    wid = start_worker(client, clock, key, loop, target_concurrency=2)
    redis_client.set(worker_heartbeat_key(wid), json.dumps({"at": clock().timestamp()}), ex=10)
    first = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    second = submit(client, key)
    report(client, clock, wid, "busy")
    a1, a2 = claim(client, first, wid), claim(client, second, wid)
    clock.advance(0.3)
    complete(client, first, wid, a1, prompt=10, gen=20)
    complete(client, second, wid, a2, prompt=5, gen=5)
    report(client, clock, wid, "idle")
    for state in ("draining", "stopped"):
        report(client, clock, wid, state)
    loop.tick(clock())
    loop.tick(clock())  # replay: allocation is idempotent

    recs = records(client, key, worker_id=wid)
    assert [r["phase"] for r in recs] == ["boot", "load", "warm", "idle", "busy", "idle", "drain"]
    for a, b in itertools.pairwise(recs):
        assert a["end"] == b["start"], "segments tile the worker's life"
    busy = Decimal(recs[4]["amount"])
    usage = {u["job_id"]: u for u in client.get("/v1/usage", headers=h(key)).json()["data"]}
    costs = {j: Decimal(usage[j]["cost"]) for j in (first, second)}
    assert sum(costs.values()) == busy, "job shares add up to the busy amount exactly"
    assert costs[first] > costs[second] * 2, "30 tokens vs 10 tokens over the same time"
    idle = sum(Decimal(r["amount"]) for r in recs if r["phase"] != "busy")
    assert sum(costs.values()) + idle == sum(Decimal(r["amount"]) for r in recs)
    assert usage[first]["prompt_tokens"] == 10 and usage[first]["workers"] == [wid]
    assert usage[first]["boot_wait_s"] > 0, "it waited on the worker booting for it"
    assert client.get("/v1/billing/check", headers=h(key)).json() == {"ok": True, "issues": []}


def test_boot_beyond_max_boot_s_is_not_billed(
    client: TestClient, keys: dict[str, str], loop: Reconciler, clock: SteppedClock
) -> None:
    deploy(client, keys["a"], max_boot_s=1)
    submit(client, keys["a"])
    loop.tick(clock())
    wid = provider(loop).started[-1].worker_id
    with loop.sessions() as s:
        w = s.get(Worker, wid)
        assert w is not None
        w.started_at = w.state_since = clock() - timedelta(seconds=10)
        t0 = w.state_since.timestamp()
        s.commit()
    report(client, clock, wid, "loading", t0 + 0.75)
    report(client, clock, wid, "warming", t0 + 2.0)
    recs = records(client, keys["a"], worker_id=wid)
    assert [(r["phase"], r["seconds"], r["billed_seconds"], r["note"]) for r in recs] == [
        ("boot", "0.750", "0.750", None),
        ("load", "1.250", "0.250", "boot_cap"),
    ]
    rate = Decimal(recs[1]["rate_per_s"])
    assert Decimal(recs[1]["amount"]) == (Decimal("0.250") * rate).quantize(Decimal("1e-9"))


def test_lost_worker_attempt_is_not_billed_and_retry_is_billed_once(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
) -> None:
    key = keys["a"]
    wid = start_worker(client, clock, key, loop)
    jid = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    redis_client.set(worker_heartbeat_key(wid), json.dumps({"at": clock().timestamp()}), ex=10)
    report(client, clock, wid, "busy")
    claim(client, jid, wid)
    clock.advance(0.2)
    loop.tick(clock())  # records the heartbeat
    redis_client.delete(worker_heartbeat_key(wid))  # SIGKILL: no more heartbeats
    loop.tick(clock() + timedelta(seconds=60))
    recs = records(client, key, worker_id=wid)
    assert recs[-1]["phase"] == "busy" and recs[-1]["note"] == "heartbeat"
    # The dead worker's busy time ended at its last heartbeat, not when it was noticed.
    assert Decimal(recs[-1]["seconds"]) < 5

    w2 = "wrk_second"
    with loop.sessions() as s:
        dead = s.get(Worker, wid)
        assert dead is not None and dead.state == "failed"
        s.add(
            Worker(
                id=w2,
                deployment_id=dead.deployment_id,
                deployment_version=1,
                tenant_id=dead.tenant_id,
                accelerator="cpu",
                state="idle",
                state_since=clock(),
                started_at=clock(),
            )
        )
        s.commit()
    report(client, clock, w2, "busy")
    attempt = claim(client, jid, w2)
    assert attempt == 2
    complete(client, jid, w2, attempt, prompt=3, gen=3)
    report(client, clock, w2, "idle")
    loop.tick(clock() + timedelta(seconds=61))
    usage = next(
        u for u in client.get("/v1/usage", headers=h(key)).json()["data"] if u["job_id"] == jid
    )
    busy2 = [r for r in records(client, key, worker_id=w2) if r["phase"] == "busy"]
    assert Decimal(usage["cost"]) == sum(Decimal(r["amount"]) for r in busy2), "billed once"
    assert usage["workers"] == sorted([wid, w2]) and usage["attempt"] == 2


def test_long_phases_are_closed_every_minute(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
) -> None:
    wid = start_worker(client, clock, keys["a"], loop)
    redis_client.set(worker_heartbeat_key(wid), json.dumps({"at": clock().timestamp() + 90}), ex=10)
    loop.tick(clock() + timedelta(seconds=90))
    idle = [r for r in records(client, keys["a"], worker_id=wid) if r["phase"] == "idle"]
    assert idle and idle[-1]["note"] == "rolled" and Decimal(idle[-1]["seconds"]) > 60


def test_many_way_splits_balance_exactly(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
) -> None:
    """Busy records split among many jobs add up exactly on every database. (SQL SUM over
    SQLite's text decimals went through floats: about a third of such sums came back off by a
    float's last digit, and the billing check reported drift that was not there.)"""
    key = keys["a"]
    wid = start_worker(client, clock, key, loop, target_concurrency=8)
    redis_client.set(worker_heartbeat_key(wid), json.dumps({"at": clock().timestamp()}), ex=30)
    ids: list[str] = []
    pending = [client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]]
    for ways in (4, 5, 6, 7, 8, 4, 5, 6, 7, 8):
        batch = pending + [submit(client, key) for _ in range(ways - len(pending))]
        pending = []
        report(client, clock, wid, "busy")
        attempts = [claim(client, jid, wid) for jid in batch]
        clock.advance(3 * 3600 + 0.337 * ways)  # hours of busy time: amounts of whole units
        for i, (jid, attempt) in enumerate(zip(batch, attempts, strict=True)):
            complete(client, jid, wid, attempt, prompt=7 + i, gen=13 * i + 3)
        report(client, clock, wid, "idle")
        ids += batch
    loop.tick(clock())
    busy = [r for r in records(client, key, worker_id=wid) if r["phase"] == "busy"]
    assert len(busy) == 10
    usage = {
        u["job_id"]: u for u in client.get("/v1/usage?limit=200", headers=h(key)).json()["data"]
    }
    assert sum(Decimal(usage[j]["cost"]) for j in ids) == sum(Decimal(r["amount"]) for r in busy)
    assert client.get("/v1/billing/check", headers=h(key)).json() == {"ok": True, "issues": []}


def test_a_busy_segment_waits_for_its_running_job_and_older_jobs_get_none_of_it(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
) -> None:
    """A busy phase longer than a minute is closed (rolled) while its job runs: that segment
    is split only once the job has ended, and only among the jobs it served, not the worker's
    earlier ones (the tick reads a worker's recent attempts, not all of them)."""
    key = keys["a"]
    wid = start_worker(client, clock, key, loop, target_concurrency=2)
    early = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    report(client, clock, wid, "busy")
    complete(client, early, wid, claim(client, early, wid), prompt=50, gen=50)
    report(client, clock, wid, "idle")
    clock.advance(5)
    long_job = submit(client, key)
    report(client, clock, wid, "busy")
    attempt = claim(client, long_job, wid)
    clock.advance(90)
    redis_client.set(worker_heartbeat_key(wid), json.dumps({"at": clock().timestamp()}), ex=30)
    loop.tick(clock())  # rolls the open busy segment; its job still runs

    def cost(job_id: str) -> Decimal:
        usage = client.get("/v1/usage", headers=h(key)).json()["data"]
        return Decimal(next(u["cost"] for u in usage if u["job_id"] == job_id) or 0)

    busy = [r for r in records(client, key, worker_id=wid) if r["phase"] == "busy"]
    assert len(busy) == 2 and busy[-1]["note"] == "rolled"
    early_cost = cost(early)
    assert early_cost == Decimal(busy[0]["amount"]) and cost(long_job) == 0

    clock.advance(10)
    complete(client, long_job, wid, attempt, prompt=1, gen=1)
    report(client, clock, wid, "idle")
    loop.tick(clock())
    busy = [r for r in records(client, key, worker_id=wid) if r["phase"] == "busy"]
    assert len(busy) == 3
    assert cost(early) == early_cost, "an earlier job got none of the later segments"
    assert cost(long_job) == sum(Decimal(r["amount"]) for r in busy[1:])
    assert client.get("/v1/billing/check", headers=h(key)).json() == {"ok": True, "issues": []}

"""Billing end to end through the API and the loop, on real Redis and SQL (SQLite and
PostgreSQL): phase records, exact job cost shares, policy, exports, summaries, drift check."""

from __future__ import annotations

import csv
import io
import itertools
import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.protocol import worker_heartbeat_key
from control_plane.db.models import Worker
from control_plane.reconcile.driver import Reconciler
from control_plane.services.workers import worker_records
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER, deploy, h
from tests.integration.conftest import SteppedClock, provider


def report(
    client: TestClient, clock: SteppedClock, wid: str, state: str, at: float | None = None
) -> None:
    body = {"state": state, "at": clock().timestamp() if at is None else at}
    assert (
        client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER).status_code == 200
    )


def start_worker(
    client: TestClient, clock: SteppedClock, key: str, loop: Reconciler, **spec: Any
) -> str:
    """Deploy, queue a job so the loop starts a worker, and bring it to idle; returns its id."""
    deploy(client, key, **spec)
    submit(client, key)
    loop.tick(clock())
    wid = provider(loop).started[-1].worker_id
    for state in ("loading", "warming", "idle"):
        report(client, clock, wid, state)
    return wid  # the queued job stays for the caller to claim


def submit(client: TestClient, key: str, prompt: str = "x") -> str:
    r = client.post("/v1/deployments/demo/jobs", json={"input": {"prompt": prompt}}, headers=h(key))
    assert r.status_code == 202
    job_id: str = r.json()["id"]
    return job_id


def claim(client: TestClient, jid: str, wid: str) -> int:
    r = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
    assert r.status_code == 200, r.text
    attempt: int = r.json()["attempt"]
    return attempt


def complete(client: TestClient, jid: str, wid: str, attempt: int, prompt: int, gen: int) -> None:
    body = {
        "worker_id": wid,
        "attempt": attempt,
        "status": "succeeded",
        "output": {"text": "t", "finish_reason": "length"},
        "prompt_tokens": prompt,
        "generated_tokens": gen,
    }
    assert (
        client.post(f"/internal/jobs/{jid}/complete", json=body, headers=WORKER).status_code == 200
    )


def records(client: TestClient, key: str, **filters: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = client.get(
        "/v1/billing/records", params={"limit": 1000, **filters}, headers=h(key)
    ).json()["data"]
    return data


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


def test_exports_and_summaries(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    settings: Settings,
    clock: SteppedClock,
) -> None:
    key = keys["a"]
    wid = start_worker(client, clock, key, loop)
    jid = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    report(client, clock, wid, "busy")
    complete(client, jid, wid, claim(client, jid, wid), prompt=1, gen=1)
    report(client, clock, wid, "idle")
    loop.tick(clock())

    csv_text = client.get("/v1/billing/records?format=csv", headers=h(key)).text
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    assert [r["phase"] for r in rows] == [r["phase"] for r in records(client, key)]
    jsonl = client.get("/v1/usage?format=jsonl", headers=h(key)).text.splitlines()
    assert json.loads(jsonl[0])["job_id"] == jid

    total = sum(Decimal(r["amount"]) for r in records(client, key))
    for group_by in ("deployment", "day", "hour", "phase", "api_key"):
        s = client.get(f"/v1/usage/summary?group_by={group_by}", headers=h(key)).json()
        assert Decimal(s["total_amount"]) == total, group_by
    by_phase = client.get("/v1/usage/summary?group_by=phase", headers=h(key)).json()["data"]
    assert {g["group"] for g in by_phase} >= {"boot", "load", "warm", "idle", "busy"}
    bad = client.get("/v1/usage/summary?group_by=color", headers=h(key))
    assert bad.status_code == 422
    assert client.get("/v1/usage", headers=h(keys["b"])).json()["data"] == []
    metrics = client.get("/metrics", headers=h(key)).text
    assert "platform_billing_drift_issues 0" in metrics
    # platform-wide numbers: the operator's admin keys only
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=h(keys["b"])).status_code == 403
    assert client.get("/metrics", headers=h(keys["ro"])).status_code == 403


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

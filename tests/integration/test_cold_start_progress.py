"""A job waiting on a booting worker hears how the cold start goes: the reconciler (real Redis
and SQL, an injected clock, a provider that records starts) turns the worker's reported state
and its heartbeat's weight bytes into the job's status_reason, `starting` events with phase,
bytes and ETA on its stream, and a `cold_start` object on GET /v1/jobs/{id}."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.protocol import cold_start_key
from control_plane.reconcile.driver import Reconciler
from tests.integration.api_helpers import beat, deploy, h, past, report, starting_events
from tests.integration.conftest import SteppedClock, provider


class PinnedClock(SteppedClock):
    """Real time plus the offset, or exactly `pinned` while a read is pinned to a tick."""

    def __init__(self) -> None:
        super().__init__()
        self.pinned: datetime | None = None

    def __call__(self) -> datetime:
        return self.pinned if self.pinned is not None else super().__call__()


@pytest.fixture
def clock() -> PinnedClock:
    return PinnedClock()


def job_at(
    client: TestClient, clock: PinnedClock, key: str, job_id: str, at: datetime
) -> dict[str, Any]:
    """GET /v1/jobs/{id} with the API's clock at `at`, the time of the test's last tick: the
    reconciler's and the API's clocks are one (a stored cold start's ETA is counted down
    from its tick by the reader). Pinned, not offset from real time: on a loaded machine the
    request itself took most of a second, and the ETA read that much lower."""
    clock.pinned = at
    try:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=h(key)).json()
        return job
    finally:
        clock.pinned = None


def first_boot(client: TestClient, key: str, loop: Reconciler) -> tuple[str, str, datetime]:
    """A deployment's first job, and the worker a tick started for it: (job, worker, tick)."""
    deploy(client, key, max_workers=1)
    run = client.post("/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(key))
    t0 = past()
    loop.tick(t0)
    (spec,) = provider(loop).started
    return run.json()["id"], spec.worker_id, t0


def test_a_waiting_job_follows_the_cold_start_phase_by_phase(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: PinnedClock,
) -> None:
    jid, wid, t0 = first_boot(client, keys["a"], loop)
    job = job_at(client, clock, keys["a"], jid, t0)
    assert (job["status"], job["status_reason"]) == ("starting", "no_capacity")
    # the first boot of a deployment: nothing measured, no ETA yet
    assert job["cold_start"] == {
        "phase": "booting",
        "eta_s": None,
        "bytes_done": None,
        "bytes_total": None,
    }

    # weights land: 250 of 1000 bytes one second into the load → 3 s left
    report(client, wid, "loading", t0 + timedelta(seconds=1))
    beat(redis_client, wid, 250, 1000)
    loop.tick(t0 + timedelta(seconds=2))
    job = job_at(client, clock, keys["a"], jid, t0 + timedelta(seconds=2))
    assert (job["status"], job["status_reason"]) == ("starting", "loading_weights")
    assert job["cold_start"] == {
        "phase": "loading_weights",
        "eta_s": 3.0,
        "bytes_done": 250,
        "bytes_total": 1000,
    }
    assert job["eta_s"] == 3.0

    # a job that arrives during the load waits on the same worker
    late = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "y"}}, headers=h(keys["a"])
    ).json()["id"]
    beat(redis_client, wid, 750, 1000)
    loop.tick(t0 + timedelta(seconds=3))
    assert job_at(client, clock, keys["a"], late, t0 + timedelta(seconds=3))["status_reason"] == (
        "loading_weights"
    )
    report(client, wid, "warming", t0 + timedelta(seconds=4))
    loop.tick(t0 + timedelta(seconds=4.1))
    job = job_at(client, clock, keys["a"], jid, t0 + timedelta(seconds=4.1))
    assert (job["status"], job["status_reason"]) == ("starting", "warming")
    assert job["cold_start"]["phase"] == "warming"

    phases = [(e.get("phase"), e.get("bytes_done")) for e in starting_events(redis_client, jid)]
    assert phases == [
        ("booting", None),
        ("loading_weights", 250),
        ("loading_weights", 750),
        ("warming", None),
    ]
    assert [e["reason"] for e in starting_events(redis_client, late)][-1] == "warming"

    # ready: the cold start is over, GET shows none
    report(client, wid, "idle", t0 + timedelta(seconds=4.5))
    loop.tick(t0 + timedelta(seconds=5))
    job = job_at(client, clock, keys["a"], jid, t0 + timedelta(seconds=5))
    assert "cold_start" not in job or job["cold_start"] is None


def test_the_next_cold_start_has_an_eta_from_the_measured_phases(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: PinnedClock,
) -> None:
    deploy(client, keys["a"], max_workers=1)
    client.post("/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"]))
    t0 = past()
    loop.tick(t0)
    (first,) = provider(loop).started
    # boot 2 s, load 6 s, warm 1 s (the first worker's start is t0)
    for state, at_s in (("loading", 2), ("warming", 8), ("idle", 9)):
        report(client, first.worker_id, state, t0 + timedelta(seconds=at_s))
    loop.refresher.refresh(t0 + timedelta(seconds=10))
    assert first.assignment is not None
    measured = loop.refresher.latest(first.assignment.deployment_id)
    assert measured is not None
    assert measured.phase_times.boot_s is not None and abs(measured.phase_times.boot_s - 2) < 0.1
    assert measured.phase_times.load_s == 6.0 and measured.phase_times.warm_s == 1.0

    # the worker goes away; the next call boots a new one, whose ETA is known from the start
    report(client, first.worker_id, "stopped", t0 + timedelta(seconds=20))
    jid = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "y"}}, headers=h(keys["a"])
    ).json()["id"]
    t1 = t0 + timedelta(seconds=21)
    loop.tick(t1)
    assert len(provider(loop).started) == 2
    job = job_at(client, clock, keys["a"], jid, t1)
    # from the start decision on: 2 s boot + 6 s load + 1 s warm-up
    assert job["cold_start"] == {
        "phase": "booting",
        "eta_s": 9.0,
        "bytes_done": None,
        "bytes_total": None,
    }
    loop.tick(t1 + timedelta(seconds=0.5))
    job = job_at(client, clock, keys["a"], jid, t1 + timedelta(seconds=0.5))
    assert job["cold_start"]["eta_s"] == 8.5
    # counted down by the reader: the tick found nothing new to store
    stored = json.loads(redis_client.get(cold_start_key(first.assignment.deployment_id)))
    assert (stored["eta_s"], stored["at"]) == (9.0, t1.timestamp())
    (event,) = starting_events(redis_client, jid)  # the ETA moved < 1 s: no second event
    assert event == {"reason": "no_capacity", "phase": "booting", "eta_s": 9.0} | {
        "bytes_done": None,
        "bytes_total": None,
    }


def test_a_worker_waiting_for_a_node_is_what_its_callers_are_told(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: PinnedClock,
) -> None:
    jid, wid, t0 = first_boot(client, keys["a"], loop)
    why = "unschedulable: no node can take it: 0/3 nodes are available: 3 Insufficient gpu."
    provider(loop).held = {wid: why}
    loop.tick(t0 + timedelta(seconds=1))
    job = job_at(client, clock, keys["a"], jid, t0 + timedelta(seconds=1))
    assert (job["status"], job["status_reason"]) == ("starting", "no_capacity")
    assert job["cold_start"] == {
        "phase": "waiting_for_node",
        "eta_s": None,
        "bytes_done": None,
        "bytes_total": None,
        "detail": why,
    }
    # a node came: it boots
    provider(loop).held = {}
    loop.tick(t0 + timedelta(seconds=2))
    job = job_at(client, clock, keys["a"], jid, t0 + timedelta(seconds=2))
    assert job["cold_start"]["phase"] == "booting" and "detail" not in job["cold_start"]
    phases = [(e.get("phase"), e.get("detail")) for e in starting_events(redis_client, jid)]
    assert phases == [("booting", None), ("waiting_for_node", why), ("booting", None)]

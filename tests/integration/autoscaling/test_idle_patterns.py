"""The live autoscaler on the patterns of idle time: a periodic caller gets a pre-warmed worker
and none between calls; a burst's workers are kept for the next wake; a stream waking a
deployment starts no worker its booting ones will not need."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from common.protocol import (
    worker_heartbeat_key,
)
from control_plane.domain.scaling.idle import MIN_PERIOD_GAPS
from control_plane.domain.scaling.policy import DEFAULT_BOOT_S, ScalingPolicy
from tests.integration.api_helpers import deploy
from tests.integration.autoscaling.fleet import BOOT_S, TICK_S, Fleet

PERIOD_S = 30.0  # one call every 30 s, exactly
BURSTS = 14


def test_periodic_traffic_gets_a_prewarmed_worker_and_none_between_bursts(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A call every PERIOD_S: until the period is known, the worker is kept for the scale-down
    window (60 s: the next calls find it). Once 3 gaps are known (4 calls) and agree, the idle
    windows expect the next call at the period (less the early margin: the next gap is the
    shortest one time in n + 1) and boot a worker one boot before it (`prewarm`); the call
    finds it ready, and between calls the deployment runs no worker."""
    caplog.set_level(logging.INFO, logger="control_plane.reconcile")
    deploy(fleet.client, fleet.key, cold_penalty_s=10, scaledown_window_s=60)
    found_warm: list[bool] = []
    zero_between: list[bool] = []
    prewarm_seen: list[str] = []
    may_wait: list[tuple[int, float]] = []
    for burst in range(BURSTS):
        arrival = fleet.clock()
        found_warm.append(fleet.idle_worker() is not None)
        job_id = fleet.submit()
        fleet.tick()
        while (wid := fleet.idle_worker()) is None:
            fleet.tick(TICK_S)
        fleet.claim(job_id, wid)
        fleet.tick(TICK_S)
        fleet.complete(job_id)
        idle_seen = False
        while (fleet.clock() - arrival).total_seconds() < PERIOD_S:
            fleet.tick(TICK_S)
            decision = fleet.scaling()
            idle_seen |= not fleet.live() and decision["desired"] == 0
            may_wait.append((decision["ready"], decision["may_wait"]))
            if decision["reason"] == "prewarm":
                prewarm_seen.append(decision["decided_at"])
                assert decision["desired"] == 1 and burst >= MIN_PERIOD_GAPS
        zero_between.append(idle_seen)

    # Calls 1-3 (no period yet): the worker is kept through the gaps, the window's keep-alive.
    # From the 4th on (3 gaps known), it is released after each call and pre-warmed.
    learned = MIN_PERIOD_GAPS
    assert zero_between == [False] * learned + [True] * (BURSTS - learned)
    # only the first call is cold: the kept worker, then the pre-warmed ones, serve the rest
    assert found_warm == [False] + [True] * (BURSTS - 1)
    messages = [r.getMessage() for r in caplog.records]
    started = [m.endswith("(prewarm)") for m in messages if m.startswith("started worker")]
    # one worker for the first calls, then one per later call (the last for a call still to
    # come)
    assert started == [False] + [True] * (BURSTS - learned)
    decision = fleet.scaling()
    # ready 10 % before the period (the next gap is the shortest yet one time in n + 1, and
    # the window would serve it); kept past the window (the next longest gap may end anywhere
    # up to and past it)
    keep_s = 60.0 * 1.1
    assert decision["idle_windows"] == {
        "representative": True,
        "prewarm_s": pytest.approx(PERIOD_S * 0.9),
        "keepalive_s": pytest.approx(keep_s),
        "wake_requests": 1.0,  # each call comes alone
        "keepalive_levels_s": [pytest.approx(keep_s)],  # one worker, pre-warmed
    }
    assert decision["boot_s"] == BOOT_S and decision["service_s"] == TICK_S
    # the ready workers' slots free up at 1 / service_s each: jobs they start within the wait
    wait_s = min(ScalingPolicy().queue_wait_s, BOOT_S)
    assert {ready for ready, _ in may_wait} == {0, 1}
    for ready, jobs in may_wait:
        assert jobs == pytest.approx(wait_s * ready / TICK_S)
    # one pre-warm decision per expected call, one boot ahead of it
    assert len(prewarm_seen) >= BURSTS - learned
    logged = [m for m in messages if "reason prewarm" in m]
    assert len(logged) == BURSTS - learned and "demo" in logged[0]
    assert "desired 1" in logged[0]
    idle_logs = [m for m in messages if "reason idle" in m]
    assert any("next pre-warm 20" in m for m in idle_logs), "idle decisions name the pre-warm"


def test_a_deployment_called_in_a_burst_keeps_the_workers_its_next_wake_wants(
    fleet: Fleet,
) -> None:
    """12 calls at once, 2 slots per worker, 2 s jobs and 2 s boots: a worker ready at a wake
    starts 2 × (1 + 2 / 2) = 4 of its callers during a boot, so the next wake of 12 wants 3.
    Once the burst is served, its six workers are held for the queueing each spared (62 s),
    then the keep-alive keeps 3: the two above the last for the ski-rental time of their 4
    callers each (2 + 4 × 30 s), the last for the scale-down window (600 s: no past yet says a
    shorter keep-alive makes no call colder), then none."""
    deploy(
        fleet.client,
        fleet.key,
        target_concurrency=2,
        max_workers=8,
        cold_penalty_s=30,
        scaledown_window_s=600,
    )
    job_ids = [fleet.submit() for _ in range(12)]
    fleet.tick()
    fleet.tick(TICK_S)
    for pair in range(0, 12, 2):
        wid = fleet.idle_worker()
        assert wid is not None, "one worker per two calls"
        for job_id in job_ids[pair : pair + 2]:
            fleet.claim(job_id, wid)
    fleet.clock.advance(2.0)
    for job_id in job_ids:
        fleet.complete(job_id)
    quiet_at = fleet.clock()
    seen: list[tuple[float, int, str]] = []  # (seconds quiet, desired, reason)
    holds: list[list[float]] = []
    while (quiet := (fleet.clock() - quiet_at).total_seconds()) < 700:
        fleet.tick(TICK_S)
        decision = fleet.scaling()
        seen.append((quiet, decision["desired"], decision["reason"]))
        holds.append(decision["holds_s"])
    upper = 2 + 4 * 30.0  # the two workers above the last
    last = 600.0
    idle = fleet.scaling()["idle_windows"]
    assert idle["wake_requests"] == 12.0
    assert idle["keepalive_levels_s"] == [last, upper, upper]  # as the API shows them
    # the burst's first tick asked for 6 workers; each of the five above the last, ready at
    # that need, would have spared its 2 callers the boot they waited (`episode.py`): priced
    # at 2 callers, each is held for 2 + 2 × 30 s
    assert holds[0] == [2.0 + 2 * 30.0] * 5
    # not needed again once the work is done (the panic window asks for nothing with no work
    # present), and then not within the window: one such gap does not yet pay for releasing
    # them at once (`levels.best_hold_s`); each is held for the ski-rental time of its price
    assert holds[-1] == [2.0 + 2 * 30.0] * 5
    kept = [(q, d) for q, d, reason in seen if reason == "keepalive"]
    assert {d for q, d in kept if q < upper - TICK_S} == {3}, seen
    assert {d for q, d in kept if upper + TICK_S < q < last - TICK_S} == {1}, seen
    assert all(d == 0 for q, d, _ in seen if q > last + TICK_S), seen
    assert len(fleet.live()) == 0


def test_a_stream_waking_a_deployment_starts_no_worker_its_booting_ones_will_not_need(
    fleet: Fleet,
) -> None:
    """A call a second wakes a deployment whose workers have not come up yet (no boot
    measured: the 30 s prior). Slot for slot, the first 10 s start a worker per 4 calls queued;
    once the refresher has a complete 10 s bucket (`recent_rate_per_s`), the decision counts
    what the booting workers will have started by the time a new one would be ready
    (`backlog_workers`), and the queue that keeps growing starts no more."""
    deploy(fleet.client, fleet.key, target_concurrency=4, max_workers=8, queue_wait_s=0)
    seen: list[dict[str, Any]] = []
    for _ in range(40):
        fleet.submit()
        now = fleet.clock.advance(1.0)  # the workers stay booting: nothing plays them
        for wid in fleet.workers():  # alive, still booting
            beat = json.dumps({"at": now.timestamp()})
            fleet.redis.set(worker_heartbeat_key(wid), beat, ex=3600)
        fleet.loop.refresher.refresh(now)
        fleet.loop.tick(now)
        seen.append(fleet.scaling())
    last = seen[-1]
    assert last["boot_s"] == DEFAULT_BOOT_S and last["ready"] == 0 and last["queued"] == 40
    assert last["recent_rate_per_s"] == pytest.approx(1.0)
    # slot for slot the 40 queued calls would want 10 workers: the booting ones serve them
    assert last["backlog_workers"] == 0 and last["desired"] == last["actual"] < 40 / 4
    # every decision with workers booting and a rate measured counted the backlog
    counted = [d for d in seen if d["recent_rate_per_s"] is not None and d["actual"] > 0]
    assert len(counted) >= 20 and all(d["backlog_workers"] is not None for d in counted)
    assert all(d["desired"] <= d["actual"] + d["backlog_workers"] for d in counted)
    assert len(fleet.live()) == last["actual"]

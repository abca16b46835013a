"""The live autoscaler: arrivals recorded at admission (Redis), the reconciler driving
`domain.scaling.decide` with the models its refresher refits, and the decision shown by the API,
`/metrics` and `platform status` — on real Redis and SQL, through the real API.

Time is a frozen clock the test moves (`FrozenClock`): arrival gaps and tick times are exact, so
a periodic pattern is exactly periodic. The provider records starts and stops; `Fleet` plays
the workers (boot in BOOT_S, claim, complete, drain when stopped) through `/internal`, as real
workers report.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from common.protocol import (
    RECONCILER_NUDGE_KEY,
    arrival_buckets_key,
    arrival_gaps_key,
    arrival_idle_gaps_key,
    last_arrival_key,
    worker_heartbeat_key,
)
from control_plane.db.models import Deployment, Job, Worker
from control_plane.domain.scaling.history import (
    BUCKET_S,
    MAX_BUCKETS,
    MAX_GAPS,
    MAX_IDLE_GAPS,
    ArrivalHistory,
)
from control_plane.domain.scaling.idle import MIN_PERIOD_GAPS
from control_plane.domain.scaling.policy import DEFAULT_BOOT_S, ScalingPolicy
from control_plane.domain.scaling.service import SERVICE_WINDOW_S
from control_plane.reconcile.driver import Reconciler
from control_plane.services.jobs import dispatch
from control_plane.services.scaling import arrivals, scale_decisions
from sdk.cli._common import CliState
from sdk.cli.main import app as cli_app
from tests.integration.api_helpers import WORKER, deploy, h, submit
from tests.integration.conftest import SteppedClock, provider
from tests.integration.test_sdk_app import AppTransport

BOOT_S = 2.0  # every worker Fleet plays is ready this long after its start
TICK_S = 2.0  # the reconciler's tick in these tests (the production default is 0.5 s)


class FrozenClock(SteppedClock):
    """Time moves only when the test moves it (SteppedClock adds real time too)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.start + self.offset


@pytest.fixture
def clock() -> SteppedClock:
    return FrozenClock()


@dataclass
class Fleet:
    """The API, the reconciler and the workers its provider "started", on one clock."""

    client: TestClient
    loop: Reconciler
    clock: SteppedClock
    redis: redis.Redis
    key: str
    # worker id → ids of the jobs it holds
    holding: dict[str, set[str]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)

    def submit(self, **body: Any) -> str:
        return submit(self.client, self.key, **body)

    def tick(self, seconds: float = 0.0) -> None:
        """Move time, let workers due report, refit what is due (the refresher thread's work,
        done here in step), then run one reconciler tick."""
        now = self.clock.advance(seconds)
        self.play()
        self.loop.refresher.refresh(now)
        self.loop.tick(now)
        self.play()

    def play(self) -> None:
        """Workers booted BOOT_S after their start become idle; stopped ones drain, and stop
        once they hold no job."""
        now = self.clock()
        stopped = set(provider(self.loop).stopped)
        for wid, w in self.workers().items():
            if w.state == "booting" and now >= w.started_at + timedelta(seconds=BOOT_S):
                t0 = w.started_at.timestamp()
                for state, at in (("loading", 0.2), ("warming", 0.6), ("idle", 1.0)):
                    self.report(wid, state, t0 + at * BOOT_S)
                beat = json.dumps({"at": now.timestamp()})
                self.redis.set(worker_heartbeat_key(wid), beat, ex=3600)
                w.state = "idle"
            if wid in stopped and w.state in ("idle", "busy"):
                self.report(wid, "draining")  # SIGTERM: stop taking work
                w.state = "draining"
            if w.state == "draining" and not self.holding.get(wid):
                self.report(wid, "stopped")

    def workers(self) -> dict[str, Worker]:
        with self.loop.sessions() as s:
            return {w.id: w for w in s.scalars(select(Worker).order_by(Worker.started_at))}

    def live(self) -> list[Worker]:
        return [w for w in self.workers().values() if w.state not in ("stopped", "failed")]

    def idle_worker(self) -> str | None:
        stopped = set(provider(self.loop).stopped)
        return next((w.id for w in self.live() if w.state == "idle" and w.id not in stopped), None)

    def report(self, wid: str, state: str, at: float | None = None) -> None:
        body = {"state": state, "at": self.clock().timestamp() if at is None else at}
        r = self.client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER)
        assert r.status_code == 200, r.text

    def claim(self, job_id: str, wid: str) -> None:
        if not self.holding.get(wid):
            self.report(wid, "busy")
        r = self.client.post(
            f"/internal/jobs/{job_id}/claim", json={"worker_id": wid}, headers=WORKER
        )
        assert r.status_code == 200, r.text
        self.attempts[job_id] = r.json()["attempt"]
        self.holding.setdefault(wid, set()).add(job_id)

    def complete(self, job_id: str) -> None:
        [wid] = [w for w, held in self.holding.items() if job_id in held]
        body = {
            "worker_id": wid,
            "attempt": self.attempts[job_id],
            "status": "succeeded",
            "output": {"text": "ok"},
            "prompt_tokens": 1,
            "generated_tokens": 1,
        }
        r = self.client.post(f"/internal/jobs/{job_id}/complete", json=body, headers=WORKER)
        assert r.status_code == 200, r.text
        self.holding[wid].discard(job_id)
        if not self.holding[wid] and self.workers()[wid].state == "busy":
            self.report(wid, "idle")
        self.play()

    def job(self, job_id: str) -> Job:
        with self.loop.sessions() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job

    def scaling(self) -> dict[str, Any]:
        r = self.client.get("/v1/deployments/demo", headers=h(self.key))
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()["scaling"]
        return body


@pytest.fixture
def fleet(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    clock: SteppedClock,
    redis_client: Any,
) -> Fleet:
    return Fleet(client, loop, clock, redis_client, keys["a"])


def deployment_id(fleet: Fleet) -> str:
    with fleet.loop.sessions() as s:
        dep = s.scalars(select(Deployment).where(Deployment.name == "demo")).one()
        return dep.id


# --- the reconciler -------------------------------------------------------------------------


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
    Once the burst is served, the keep-alive keeps 3 workers: the two above the last for the
    ski-rental time of their 4 callers each (2 + 4 × 30 s), the last for the scale-down window
    (600 s: no past yet says a shorter keep-alive makes no call colder), then none."""
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
    # the burst's first tick asked for 6 workers; a boot later the five above the last held
    # no call (all served): a cold start of theirs makes no caller wait through a boot, and
    # each is held for the boot alone
    assert holds[0] == [2.0] * 5
    # not needed again within the window, that past says to release them at once next time
    assert holds[-1] == [0.0] * 5
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


def test_scale_down_with_long_jobs_in_flight_drains_and_kills_none(fleet: Fleet) -> None:
    """Four long jobs on two workers (two each); two end. Two jobs need one worker: after the
    hold, one busy worker is asked to stop — a drain: it takes no new work, finishes its job,
    then exits. No worker is killed and no job loses its attempt."""
    deploy(fleet.client, fleet.key, target_concurrency=2, max_workers=2, cold_penalty_s=0)
    job_ids = [fleet.submit() for _ in range(4)]
    fleet.tick()
    assert len(provider(fleet.loop).started) == 2, "4 jobs / 2 per worker"
    fleet.tick(TICK_S)
    a, b = (w.id for w in fleet.live())
    for job_id, wid in zip(job_ids, (a, a, b, b), strict=True):
        fleet.claim(job_id, wid)
    fleet.tick(TICK_S)
    fleet.complete(job_ids[1])
    fleet.complete(job_ids[3])
    p = provider(fleet.loop)
    # The scale from zero asked for 2 workers at once: KPA panic, which holds the count for a
    # stable window (60 s); then the hold (boot + 0 s); then one worker of two goes.
    while not p.stopped:
        fleet.tick(TICK_S)
        assert (fleet.clock() - fleet.job(job_ids[0]).created_at).total_seconds() < 90
    for _ in range(10):
        fleet.tick(TICK_S)
    assert len(p.stopped) == 1, "two running jobs need one worker of two slots"
    assert p.killed == []
    victim = p.stopped[0]
    assert fleet.workers()[victim].state == "draining"
    assert len(p.started) == 2, "the draining worker is not replaced: one is enough"
    assert [fleet.job(j).status for j in job_ids] == ["running", "succeeded"] * 2
    assert fleet.scaling()["reason"] == "demand"

    fleet.tick(300)  # the long jobs end; the draining worker exits only then
    for job_id in (job_ids[0], job_ids[2]):
        fleet.complete(job_id)
    fleet.tick(TICK_S)
    jobs = [fleet.job(j) for j in job_ids]
    assert [(j.status, j.attempt) for j in jobs] == [("succeeded", 1)] * 4
    assert fleet.workers()[victim].state == "stopped"
    assert p.killed == []


def test_the_service_time_is_the_last_five_minutes_mean_or_the_last_20_jobs_when_fewer(
    fleet: Fleet,
) -> None:
    """decide()'s service time (`scaling.service`) as the refresher reads it from SQL: the mean
    execution time of the jobs that ended within the last five minutes, or of the latest 20 when
    fewer ended in them; never of the deployment's whole history. One worker, kept throughout
    (a hold of 900 s), runs every job."""
    deploy(
        fleet.client,
        fleet.key,
        target_concurrency=40,
        scaledown_window_s=900,
        cold_penalty_s=900,
    )
    held_by: list[str] = []  # the one worker, once it is up

    def run(n: int, hold_s: float) -> None:
        job_ids = [fleet.submit() for _ in range(n)]
        fleet.tick()
        while not held_by:
            fleet.tick(TICK_S)
            held_by.extend(filter(None, [fleet.idle_worker()]))
        for job_id in job_ids:
            fleet.claim(job_id, held_by[0])
        fleet.clock.advance(hold_s)
        for job_id in job_ids:
            fleet.complete(job_id)

    run(20, hold_s=10.0)  # older than five minutes by the time of the reads below
    fleet.tick(SERVICE_WINDOW_S + 10)
    assert fleet.scaling()["service_s"] == 10.0, "none in the window: the last 20"
    run(15, hold_s=4.0)
    run(15, hold_s=2.0)
    fleet.tick(TICK_S)
    assert fleet.scaling()["service_s"] == 3.0, "30 jobs in the window: their mean"
    fleet.tick(SERVICE_WINDOW_S + 10)
    last_20 = (15 * 2.0 + 5 * 4.0) / 20
    assert fleet.scaling()["service_s"] == last_20, "none in the window: the last 20"
    assert [w.id for w in fleet.live()] == held_by, "one worker ran them all"


def test_the_refresher_thread_refits_off_the_tick(fleet: Fleet) -> None:
    """The tick decides on the snapshot the refresher last made: ticks without a refresh keep
    the same `models_fitted_at`; the thread (started as the reconciler process does) makes
    a new one on its own."""
    deploy(fleet.client, fleet.key, cold_penalty_s=10)
    for _ in range(12):
        fleet.submit()
        fleet.clock.advance(15)  # idle gaps: longer than the prior service time (none ran)
    fitted_at = fleet.clock()
    fleet.loop.refresher.refresh(fitted_at)
    fleet.loop.tick(fleet.clock())
    first = fleet.scaling()
    assert first["models_fitted_at"] is not None
    assert first["idle_windows"]["representative"], "11 gaps of 15 s"
    fleet.loop.tick(fleet.clock.advance(TICK_S))
    assert fleet.scaling()["models_fitted_at"] == first["models_fitted_at"], "no refit in a tick"

    fleet.clock.advance(60)
    before = fleet.loop.refresher.latest(deployment_id(fleet))
    fleet.loop.start(fleet.clock)
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while fleet.loop.refresher.latest(deployment_id(fleet)) is before:
            assert datetime.now(UTC) < deadline, "the refresher thread did not refit"
            time.sleep(0.05)
    finally:
        fleet.loop.stop()
    fleet.loop.tick(fleet.clock())
    assert fleet.scaling()["models_fitted_at"] != first["models_fitted_at"]


# --- arrivals -------------------------------------------------------------------------------


def test_arrivals_are_bounded_and_read_back_as_the_simulators_history(redis_client: Any) -> None:
    """Redis keeps the same bins as `ArrivalHistory` (the simulator's): the snapshots agree
    exactly (the pauses from before the last gaps included), and memory stays bounded — at most
    MAX_BUCKETS buckets, MAX_GAPS gaps and MAX_IDLE_GAPS pauses — with a TTL on every key."""
    rng = random.Random(7)
    history = ArrivalHistory()
    start = t = 1_700_000_000.123
    for _ in range(3_000):
        at = datetime.fromtimestamp(
            t + rng.choice([0.0, 0.3, 2.5, 11.0, rng.expovariate(0.2)]), UTC
        )
        t = at.timestamp()  # what the clock gives: microseconds
        n = rng.choice([1, 1, 1, 3])
        history.record(t, n)
        assert arrivals.record(redis_client, "dep_x", at, n)
    assert t - start > 2 * MAX_BUCKETS * BUCKET_S, "longer than the bucket window"
    for later in (0.0, 5.0, 3_000.0):
        now = datetime.fromtimestamp(t + later, UTC)
        assert arrivals.read(redis_client, "dep_x", now) == history.stats(now.timestamp())
    assert redis_client.hlen(arrival_buckets_key("dep_x")) <= MAX_BUCKETS
    assert redis_client.llen(arrival_gaps_key("dep_x")) == MAX_GAPS
    assert redis_client.llen(arrival_idle_gaps_key("dep_x")) == MAX_IDLE_GAPS
    for key in (arrival_buckets_key, arrival_gaps_key, arrival_idle_gaps_key, last_arrival_key):
        assert 0 < redis_client.ttl(key("dep_x")) <= arrivals.ARRIVALS_TTL_S
    assert arrivals.last_arrivals(redis_client, ["dep_x", "dep_none"]) == {
        "dep_x": t,
        "dep_none": None,
    }


def test_a_call_to_a_deployment_without_workers_wakes_the_reconciler_at_once(
    redis_client: Any,
) -> None:
    at = datetime.now(UTC)
    # no decision yet (a new deployment): the call nudges; several calls, one nudge
    for _ in range(3):
        assert arrivals.record(redis_client, "dep_x", at)
    assert redis_client.lrange(RECONCILER_NUDGE_KEY, 0, -1) == [b"1"]
    ticked = time.monotonic()
    assert arrivals.wait_for_work(redis_client, 5.0, ticked)
    assert time.monotonic() - ticked < 1.0  # woken, not timed out
    assert redis_client.llen(RECONCILER_NUDGE_KEY) == 0
    # a deployment with a worker (its decision counts one): no nudge; the pause is the interval
    scale_decisions.publish(redis_client, [("dep_x", {"actual": 1, "reason": "demand"})])
    assert arrivals.record(redis_client, "dep_x", at)
    assert redis_client.llen(RECONCILER_NUDGE_KEY) == 0
    assert not arrivals.wait_for_work(redis_client, 0.2, time.monotonic())
    # at zero again: nudged
    scale_decisions.publish(redis_client, [("dep_x", {"actual": 0, "reason": "idle"})])
    assert arrivals.record(redis_client, "dep_x", at)
    assert redis_client.llen(RECONCILER_NUDGE_KEY) == 1


def test_an_arrival_goes_in_its_wake_ups_round_trip_even_when_redis_lost_the_script(
    redis_client: Any,
) -> None:
    """An admission's arrival is sent by the script's hash in the wake-up's pipeline; a Redis
    that does not know the script (restarted, flushed) still records it, and the wake-up is
    sent either way."""
    redis_client.script_flush()
    first = datetime.now(UTC)
    assert dispatch.wake(redis_client, "dep_x", "job_1", "async", arrival=first)
    assert float(redis_client.get(last_arrival_key("dep_x"))) == first.timestamp()
    later = first + timedelta(seconds=2.5)
    assert dispatch.wake(redis_client, "dep_x", "job_2", "async", arrival=later)
    stats = arrivals.read(redis_client, "dep_x", later)
    history = ArrivalHistory()
    history.record(first.timestamp(), 1)
    history.record(later.timestamp(), 1)
    assert stats == history.stats(later.timestamp())
    queue, _ = dispatch.wakeup("dep_x", "job_1", "async")
    woken = [json.loads(m) for m in redis_client.lrange(queue, 0, -1)]
    assert len(woken) == 2


def test_every_admission_records_an_arrival_on_the_apps_clock(fleet: Fleet) -> None:
    """A job, a run and each batch line (when dispatched) is an arrival at the API's clock."""
    deploy(fleet.client, fleet.key)
    dep_id = deployment_id(fleet)
    t0 = fleet.clock()
    fleet.submit()
    fleet.clock.advance(7)
    r = fleet.client.post(
        "/v1/deployments/demo/run", json={"input": {"prompt": "x"}, "wait_s": 0.01},
        headers=h(fleet.key),
    )  # fmt: skip
    assert r.status_code == 202
    fleet.clock.advance(13)
    batch = fleet.client.post(
        "/v1/batches",
        json={"deployment": "demo", "inputs": [{"prompt": "a"}] * 3, "max_in_flight": 2},
        headers=h(fleet.key),
    )
    assert batch.status_code == 201, batch.text
    stats = arrivals.read(fleet.redis, dep_id, fleet.clock())
    assert stats.last_arrival_at == (t0 + timedelta(seconds=20)).timestamp()
    assert stats.gaps == (7.0, 13.0, 0.0), "two batch lines dispatched at once"
    assert sum(stats.counts) == 2, "complete buckets only: the batch's is still open"

    fleet.tick(30)  # nothing frees a batch slot yet: the third line has not arrived
    assert arrivals.read(fleet.redis, dep_id, fleet.clock()).gaps == (7.0, 13.0, 0.0)
    with fleet.loop.sessions() as s:
        first = s.scalars(select(Job).where(Job.batch_index == 0)).one()
        fleet.client.post(f"/v1/jobs/{first.id}/cancel", headers=h(fleet.key))
    # the canceled line hands its slot to the third line, which arrives now (not at a tick)
    stats = arrivals.read(fleet.redis, dep_id, fleet.clock())
    assert stats.gaps == (7.0, 13.0, 0.0, 30.0)
    assert sum(stats.counts) == 4, "the third line is in the open bucket"
    fleet.tick(1)  # and the pump adds nothing: no slot is free
    assert arrivals.read(fleet.redis, dep_id, fleet.clock()).gaps == (7.0, 13.0, 0.0, 30.0)


def test_a_redis_outage_does_not_fail_admission(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    deploy(fleet.client, fleet.key)
    ctx = fleet.client.app.state.ctx  # type: ignore[attr-defined]

    def down(*_args: Any, **_kw: Any) -> Any:
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(ctx.redis, "execute_command", down)
    monkeypatch.setattr(redis.client.Pipeline, "execute", down)  # the wake-up's round trip
    job_id = fleet.submit()
    assert fleet.job(job_id).status == "queued", "committed and acknowledged"
    assert any("not recorded" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    stats = arrivals.read(fleet.redis, deployment_id(fleet), fleet.clock())
    assert stats.last_arrival_at is None, "the arrival was lost, the job was not"


# --- what the decision looks like from outside ----------------------------------------------


def test_the_deployment_shows_the_latest_decision_in_api_metrics_and_cli(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    deploy(fleet.client, fleet.key)
    assert fleet.client.get("/v1/deployments/demo", headers=h(fleet.key)).json()["scaling"] is None
    fleet.submit()
    fleet.tick()
    decision = fleet.scaling()
    assert decision["desired"] == 1 and decision["actual"] == 0
    assert decision["reason"] == "scale_from_zero"
    assert decision["decided_at"] == fleet.clock().isoformat().replace("+00:00", "Z")
    assert (decision["queued"], decision["running"]) == (1, 0)
    assert decision["boot_s"] == DEFAULT_BOOT_S, "the prior until a worker of the version booted"
    assert decision["idle_windows"]["representative"] is False
    assert decision["forecast"] is None
    listed = fleet.client.get("/v1/deployments", headers=h(fleet.key)).json()["data"]
    assert listed[0]["scaling"] == decision

    fleet.tick(TICK_S)
    decision = fleet.scaling()
    assert (decision["desired"], decision["actual"], decision["ready"]) == (1, 1, 1)
    metrics = fleet.client.get("/metrics", headers=h(fleet.key)).text
    assert 'platform_scale_decisions_total{reason="scale_from_zero"} 1' in metrics
    assert 'platform_scale_decisions_total{reason="demand"} 1' in metrics

    # `platform status`, through the SDK, against this app
    monkeypatch.setenv("PLATFORM_CONFIG", str(tmp_path / "config.json"))
    state = CliState(
        url="http://testserver",
        api_key=fleet.key,
        client_options={"transport": AppTransport(fleet.client), "sleep": lambda _s: None},
    )
    result = CliRunner().invoke(cli_app, ["status"], obj=state)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("demo\t"))
    assert row.endswith("\t1\t1\tdemand\t-"), row
    result = CliRunner().invoke(cli_app, ["status", "--json"], obj=state)
    assert json.loads(result.stdout)["deployments"][0]["scaling"]["reason"] == "demand"

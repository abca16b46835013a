"""The autoscaler's inputs and outputs in the live platform: arrivals recorded at every
admission (bounded, on the API's clock, in the wake-up's round trip, through a Redis outage), a
call at zero waking the reconciler at once, and the decision shown by the API, /metrics and
the CLI."""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import select
from typer.testing import CliRunner

from common.protocol import (
    RECONCILER_NUDGE_KEY,
    arrival_buckets_key,
    arrival_gaps_key,
    arrival_idle_gaps_key,
    in_flight_key,
    last_arrival_key,
    peak_in_flight_key,
)
from control_plane.db.models import Job
from control_plane.domain.scaling.decide import DeploymentState, ScaleDecision
from control_plane.domain.scaling.decide import decide as scaling_decide
from control_plane.domain.scaling.history import (
    BUCKET_S,
    MAX_BUCKETS,
    MAX_GAPS,
    MAX_IDLE_GAPS,
    ArrivalHistory,
)
from control_plane.domain.scaling.policy import DEFAULT_BOOT_S
from control_plane.reconcile import scale
from control_plane.services.jobs import dispatch
from control_plane.services.scaling import arrivals, scale_decisions
from sdk.cli._common import CliState
from sdk.cli.main import app as cli_app
from tests.integration.api_helpers import deploy, h
from tests.integration.autoscaling.fleet import TICK_S, Fleet, deployment_id
from tests.integration.test_sdk_app import AppTransport


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


def test_the_work_in_flight_between_ticks_reaches_the_decision_as_its_peak(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admissions count a deployment's jobs in flight up, ends down; each tick hands the most
    there were at an admission since the last tick to `decide` and starts again from the
    database's count."""
    deploy(fleet.client, fleet.key)
    dep_id = deployment_id(fleet)
    peaks: list[int] = []

    def decide(state: DeploymentState, now: float) -> ScaleDecision:
        peaks.append(state.peak_demand)
        return scaling_decide(state, now)

    monkeypatch.setattr(scale, "decide", decide)

    def counted() -> tuple[int | None, int | None]:
        values = fleet.redis.mget([in_flight_key(dep_id), peak_in_flight_key(dep_id)])
        return (None if values[0] is None else int(values[0]),
                None if values[1] is None else int(values[1]))  # fmt: skip

    fleet.tick(1)
    assert peaks[-1] == 0, "nothing in flight"
    jobs = [fleet.submit() for _ in range(3)]
    assert counted() == (3, 3)
    for job_id in jobs[:2]:
        r = fleet.client.post(f"/v1/jobs/{job_id}/cancel", headers=h(fleet.key))
        assert r.status_code == 200, r.text
    assert counted() == (1, 3), "two ended: one in flight, the peak stays"
    fleet.tick(1)
    assert peaks[-1] == 3, "the peak between the ticks, not the one job present"
    assert counted() == (1, None), "the database's count; no peak yet"
    fleet.submit()
    assert counted() == (2, 2)
    fleet.tick(1)
    assert peaks[-1] == 2
    fleet.redis.set(in_flight_key(dep_id), 40)  # an end that Redis missed
    fleet.tick(1)
    assert peaks[-1] == 2, "no admission since: the work present"
    assert counted() == (2, None), "set right by the tick"


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

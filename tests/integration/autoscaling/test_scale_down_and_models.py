"""The live autoscaler scaling down (drains, kills none) and refitting its models off the tick
(the service time's window, the refresher thread)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from control_plane.domain.scaling.service import SERVICE_WINDOW_S
from tests.integration.api_helpers import deploy
from tests.integration.autoscaling.fleet import TICK_S, Fleet, deployment_id
from tests.integration.conftest import provider


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

"""`decide()` as pure logic, on a fake clock (plain floats): each part of the decision."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from control_plane.domain.scaling import (
    ArrivalHistory,
    ConcurrencyWindow,
    DeploymentState,
    Memory,
    ScaleDecision,
    ScalingPolicy,
    decide,
    refit,
)
from control_plane.domain.scaling.backlog import backlog_workers
from control_plane.domain.scaling.decide import (
    MAX_TICK_S,
    REASONS,
    keepalive_levels,
    wake_callers,
    wake_levels,
)
from control_plane.domain.scaling.idle import PLAIN, IdleWindows
from control_plane.domain.scaling.levels import Levels
from control_plane.domain.scaling.models import NONE, Models
from control_plane.domain.scaling.policy import hold_s, waits_allowed

T0 = 1_000_000.0
# Each part on its own: no job may wait for a ready worker here (the wait has its own tests).
POLICY = ScalingPolicy(
    min_workers=0, max_workers=8, target_concurrency=4, scaledown_window_s=600, queue_wait_s=0
)
WAITING = dataclasses.replace(POLICY, queue_wait_s=2.0)
SERVICE_S = 5.0  # what a job holds its slot, as the states below say


def state(**kw: object) -> DeploymentState:
    base = DeploymentState(
        policy=POLICY,
        queued=0,
        running=0,
        ready=0,
        booting_since=(),
        stable_concurrency=0.0,
        panic_concurrency=0.0,
        last_arrival_at=None,
        boot_s=30.0,
        service_s=SERVICE_S,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def run(s: DeploymentState, now: float) -> ScaleDecision:
    d = decide(s, now)
    assert d.reason in REASONS
    return d


def test_nothing_runs_while_nobody_calls() -> None:
    d = run(state(), T0)
    assert (d.desired, d.start, d.reason) == (0, 0, "idle")


def test_scale_from_zero_counts_queued_and_running_work() -> None:
    d = run(state(queued=1, last_arrival_at=T0), T0)
    assert (d.desired, d.start, d.reason) == (1, 1, "scale_from_zero")
    # running (reserved) work counts as much as queued work: never queue length alone
    d = run(state(queued=2, running=7, ready=1, last_arrival_at=T0), T0)
    assert (d.desired, d.reason) == (3, "demand")  # ceil(9 / 4)


def test_booting_workers_count_as_capacity() -> None:
    d = run(state(queued=3, booting_since=(T0 - 5,), last_arrival_at=T0), T0)
    assert (d.desired, d.capacity, d.start) == (1, 1, 0)


def test_boot_overrun_is_not_capacity_and_gets_a_replacement() -> None:
    policy = dataclasses.replace(POLICY, max_boot_s=60)
    d = run(state(policy=policy, queued=3, booting_since=(T0 - 61,), last_arrival_at=T0), T0)
    assert (d.desired, d.capacity, d.start) == (1, 0, 1)


def test_panic_scales_up_and_never_down_while_it_lasts() -> None:
    d = run(state(ready=1, running=4, stable_concurrency=4, panic_concurrency=12), T0)
    assert (d.desired, d.reason) == (3, "panic")
    assert d.memory.panic_until == T0 + 60
    # the burst is gone but panic mode holds the count for a stable window
    later = state(ready=3, running=4, panic_concurrency=0.0, memory=d.memory, last_arrival_at=T0)
    d2 = run(later, T0 + 30)
    assert d2.desired == 3
    d3 = run(dataclasses.replace(later, memory=d2.memory), T0 + 59)
    assert (d3.desired, d3.reason) == (3, "panic")
    # panic is over; the workers are held for the ski-rental time of the callers they held a
    # boot after their need (none: a boot, 30 s, from their last need), then released
    d4 = run(dataclasses.replace(later, memory=d3.memory), T0 + 61)
    assert (d4.desired, d4.reason) == (3, "hold")
    d5 = run(dataclasses.replace(later, memory=d4.memory), T0 + 59 + 30 + 1)
    assert (d5.desired, d5.reason) == (1, "scale_down")


def test_stable_window_adds_workers_above_the_first() -> None:
    d = run(state(ready=2, running=8, stable_concurrency=10, panic_concurrency=10), T0)
    assert (d.desired, d.reason) == (3, "stable_window")


def test_a_short_queue_waits_for_the_ready_workers_instead_of_a_new_one() -> None:
    # one ready worker frees 4 slots per 5 s job: 1.6 jobs start within the 2 s wait
    assert waits_allowed(WAITING, ready=1, boot_s=30.0, service_s=5.0) == pytest.approx(1.6)
    full = state(policy=WAITING, ready=1, running=4, queued=1, last_arrival_at=T0)
    d = run(full, T0)
    assert (d.desired, d.start) == (1, 0)
    # without the wait the same job boots a worker
    assert run(dataclasses.replace(full, policy=POLICY), T0).start == 1
    # more than the ready worker starts within the wait: a worker for the rest
    d = run(dataclasses.replace(full, queued=2), T0)
    assert (d.desired, d.start, d.reason) == (2, 1, "demand")


def test_only_ready_workers_take_waiting_jobs() -> None:
    # from zero, and while the only worker boots, every waiting job counts in full
    d = run(state(policy=WAITING, queued=1, last_arrival_at=T0), T0)
    assert (d.desired, d.reason) == (1, "scale_from_zero")
    booting = state(policy=WAITING, queued=5, booting_since=(T0 - 5,), last_arrival_at=T0)
    assert run(booting, T0).start == 1  # ceil(5 / 4) = 2, one already booting


def test_a_job_waiting_for_the_only_ready_worker_keeps_it() -> None:
    # just arrived, not claimed yet: the worker it waits for stays, whatever the idle windows say
    s = state(policy=WAITING, queued=1, ready=1, last_arrival_at=T0, service_s=0.1)
    d = run(s, T0)
    assert (d.desired, d.reason) == (1, "demand")


def test_the_wait_is_never_longer_than_a_boot() -> None:
    slow = dataclasses.replace(WAITING, queue_wait_s=10.0)
    # a worker started now would be ready in 3 s: nobody is left to wait longer than that
    assert waits_allowed(slow, ready=2, boot_s=3.0, service_s=6.0) == pytest.approx(4.0)


def test_a_backlog_counts_what_the_booting_workers_will_have_started_by_a_new_ones_boot() -> None:
    # two workers booting, ready in 5 s and in 25 s; a worker started now is ready in 30 s.
    # By then the first has started 4 slots and turned them over 25 / 5 - 0.5 times (a fresh
    # slot lags: `FRESH_SLOT_LAG`), the second 4 and 5 / 5 - 0.5: 22 + 6 = 28 jobs
    wave = {
        "now": T0,
        "boot_s": 30.0,
        "service_s": SERVICE_S,
        "ready": 0,
        "running": 0,
        "queued": 10,
        "ready_at": (T0 + 5, T0 + 25),
    }
    assert backlog_workers(POLICY, **wave, rate=0.2) == 0  # 10 + 6 arriving over the boot < 28
    assert backlog_workers(POLICY, **wave, rate=0.8) == 2  # 10 + 24 - 28 = 6 left: 2 workers
    # 6 left, of which 2 × 4 / 5 × 2 s = 3.2 start on those two within the wait: 1 worker
    assert backlog_workers(WAITING, **wave, rate=0.8) == 1
    # a ready worker takes a job on its free slot now and turns its 4 slots over 30 / 5 times
    ready = {**wave, "ready": 1, "running": 3, "ready_at": ()}
    assert backlog_workers(POLICY, **ready, rate=0.5) == 0  # 10 + 15 - (1 + 24) = 0
    assert backlog_workers(POLICY, **ready, rate=0.8) == 3  # 10 + 24 - 25 = 9 left


def test_while_workers_boot_the_backlog_they_will_serve_starts_no_more() -> None:
    booting = state(queued=10, booting_since=(T0 - 25, T0 - 5), last_arrival_at=T0)
    # slot for slot (no rate measured yet): ceil(10 / 4) = 3 workers, 2 booting: start 1
    d = run(booting, T0)
    assert (d.desired, d.start, d.backlog_workers) == (3, 1, None)
    # the two booting will have started the 10 and the 6 arriving over a boot: start none
    calm = dataclasses.replace(booting, models=Models(T0 - 1, None, PLAIN, recent_rate=0.2))
    d = run(calm, T0)
    assert (d.desired, d.start, d.backlog_workers, d.reason) == (2, 0, 0, "demand")
    # a faster stream leaves 6 jobs waiting then: the part's own count (3) still bounds it
    busy = dataclasses.replace(booting, models=Models(T0 - 1, None, PLAIN, recent_rate=0.8))
    d = run(busy, T0)
    assert (d.desired, d.start, d.backlog_workers) == (3, 1, 2)
    # panic asks for the queue too (6 s mean of 10): bounded the same way
    panic = dataclasses.replace(calm, panic_concurrency=10.0, stable_concurrency=10.0)
    assert run(panic, T0).start == 0
    # with nothing booting the rule does not apply: the workers there serve at their pace
    ready = dataclasses.replace(calm, booting_since=(), ready=2, running=8)
    assert run(ready, T0).backlog_workers is None


def test_the_windows_and_the_forecast_leave_out_what_may_wait() -> None:
    # 2 ready workers start 3.2 jobs within 2 s: a 60 s mean of 10 no longer asks for a third
    busy = state(ready=2, running=8, stable_concurrency=10, panic_concurrency=10)
    assert run(busy, T0).desired == 3
    d = run(dataclasses.replace(busy, policy=WAITING), T0)
    assert (d.desired, d.reason) == (2, "demand")
    # a panic window of 9 on one worker asks for 3 without the wait, 2 with it
    spike = state(ready=1, running=4, stable_concurrency=4, panic_concurrency=9)
    assert run(spike, T0).desired == 3
    assert run(dataclasses.replace(spike, policy=WAITING), T0).desired == 2
    # the forecast's concurrency too (the ramp below), but only its swings above the mean
    # load at the end of the boot: a queue cannot absorb a load that lasts
    ramp = forecast_state()
    waiting = run(dataclasses.replace(ramp, policy=WAITING), T0)
    assert waiting.desired <= run(ramp, T0).desired
    assert ramp.models.forecast is not None
    load = ramp.models.forecast.rate(T0 + ramp.boot_s)[0] * ramp.service_s
    assert waiting.desired * WAITING.target_concurrency >= load
    much_longer = dataclasses.replace(WAITING, queue_wait_s=30.0)
    assert run(dataclasses.replace(ramp, policy=much_longer), T0).desired == math.ceil(load / 4)


def test_min_and_max_workers_bound_the_count() -> None:
    policy = dataclasses.replace(POLICY, min_workers=2, max_workers=3)
    assert run(state(policy=policy, ready=2), T0).desired == 2
    d = run(state(policy=policy, ready=2, queued=40), T0)
    assert (d.desired, d.reason) == (3, "max_workers")


def test_unneeded_workers_are_held_for_the_ski_rental_time_then_halved() -> None:
    busy = state(ready=4, running=16, last_arrival_at=T0)
    d = run(busy, T0)
    assert d.desired == 4
    # still busy a boot later: each worker above the first holds 4 callers that a
    # replacement started at the need would only now serve
    d = run(dataclasses.replace(busy, memory=d.memory), T0 + 30)
    hold = hold_s(POLICY, 30.0, 4.0)  # 30 s boot + 4 × 60 s penalty
    quiet = state(ready=4, last_arrival_at=T0 + 30, memory=d.memory)
    d = run(quiet, T0 + 30 + hold - 1)
    assert (d.desired, d.reason) == (4, "hold")
    d = run(dataclasses.replace(quiet, memory=d.memory), T0 + 30 + hold + 1)
    # scale-down removes at most half per tick; the reconciler drains what goes
    assert (d.desired, d.reason) == (2, "scale_down")


def test_a_worker_needed_again_at_each_swing_is_held_through_the_swings() -> None:
    # three workers' slots full for 40 s every 400 s, two workers' worth between: the third
    # worker still holds 4 callers a boot into each swing (a 270 s ski-rental time), and the
    # swings come 360 s apart: it is held through them once it has seen them (`levels.py`)
    swing = state(ready=3, running=12)
    calm = state(ready=3, running=8)
    memory = swing.memory
    for i in range(4):
        at = T0 + i * 400.0
        for t in (at, at + 30.0, at + 40.0):
            s = dataclasses.replace(swing, last_arrival_at=t, memory=memory)
            memory = run(s, t).memory
    last = T0 + 3 * 400.0 + 40.0
    calm = dataclasses.replace(calm, last_arrival_at=last, memory=memory)
    assert run(calm, last + hold_s(POLICY, 30.0, 4.0) + 10).reason == "hold"
    assert run(calm, last + 350.0).reason == "hold"
    d = run(calm, last + 362.0)
    assert (d.desired, d.reason) == (2, "scale_down")


def test_last_worker_follows_the_plain_window_until_the_histogram_is_representative() -> None:
    hold = POLICY.scaledown_window_s  # the window's keep-alive: the ski-rental rule at its price
    s = state(ready=1, last_arrival_at=T0)
    assert run(s, T0 + hold - 1).desired == 1
    assert run(s, T0 + hold + 1).desired == 0


def test_the_plain_window_is_the_scale_down_window_whatever_a_wake_costs() -> None:
    # a deployment called in bursts: three callers come within a boot of each wake (too few
    # gaps yet for the idle windows); priced for one caller or three, the last worker is kept
    # for the window: nothing learned yet may make a call colder than the window's keep-alive
    history = ArrivalHistory()
    for burst in range(3):
        for i in range(3):
            history.record(T0 - 3000 + burst * 900 + i)
    models = refit(history.stats(T0), POLICY, 30.0, SERVICE_S)
    assert not models.idle.representative and models.idle.wake_requests == 3.0
    assert models.idle.wakes == (3.0, 3.0)  # the first burst starts the history: not a wake
    hold = POLICY.scaledown_window_s
    s = state(ready=1, last_arrival_at=T0, models=dataclasses.replace(models, fitted_at=T0))
    assert run(s, T0 + hold - 1).reason == "keepalive"
    assert run(s, T0 + hold + 1).desired == 0


def periodic_models(
    period_s: float, jitter_s: float, n: int, boot_s: float
) -> tuple[Models, float]:
    rng = random.Random(7)
    history, t = ArrivalHistory(), T0
    for _ in range(n):
        t += period_s + rng.uniform(-jitter_s, jitter_s)
        history.record(t)
    return refit(history.stats(t + 1), POLICY, boot_s, SERVICE_S), t


def test_prewarm_before_a_predicted_periodic_arrival_and_zero_between() -> None:
    models, last = periodic_models(900, 15, 40, 30)
    assert models.idle.representative and models.idle.prewarm_s is not None
    s = state(last_arrival_at=last, models=dataclasses.replace(models, fitted_at=last + 400))
    between = run(s, last + 400)
    assert (between.desired, between.reason) == (0, "idle")
    boot_at = last + models.idle.prewarm_s - 30 - MAX_TICK_S
    assert between.next_prewarm_at == pytest.approx(boot_at)
    # the worker is started a boot (and a tick) before the next arrival is expected (every
    # 900 ± 15 s)
    assert 800 < boot_at - last <= 900 - 30 - MAX_TICK_S
    warm = run(
        dataclasses.replace(s, models=dataclasses.replace(models, fitted_at=boot_at)), boot_at
    )
    assert (warm.desired, warm.start, warm.reason) == (1, 1, "prewarm")
    # and released when the window ends without an arrival
    end = last + models.idle.keepalive_s
    gone = run(
        dataclasses.replace(s, ready=1, models=dataclasses.replace(models, fitted_at=end)), end + 1
    )
    assert gone.desired == 0


def test_a_batch_on_a_schedule_gets_the_workers_it_wants_prewarmed() -> None:
    """A job that submits 40 calls at once every 10 minutes (10 ms apart): a worker ready at a
    wake starts 4 × (1 + 30 / 5) = 28 of them during a boot, so the batch wants a second worker
    for its 12 others; their wait through a boot, priced, is worth more than that worker's
    idle time from the pre-warm to the keep-alive. A cron job firing one call gets one."""
    rng = random.Random(11)

    def prewarmed(calls: int) -> ScaleDecision:
        history, t = ArrivalHistory(), T0
        for _ in range(6):  # fewer than the 256 gaps the history keeps: 5 idle gaps in it
            t += 600 + rng.uniform(-6, 6)
            for i in range(calls):
                history.record(t + i * 0.01)
        last = t + (calls - 1) * 0.01
        models = refit(history.stats(last + 1), POLICY, 30.0, SERVICE_S)
        assert models.idle.prewarms
        assert models.idle.wake_requests == calls
        boot_at = last + models.idle.prewarm_s - 30 - MAX_TICK_S
        fitted = dataclasses.replace(models, fitted_at=boot_at)
        return run(state(last_arrival_at=last, models=fitted), boot_at + 1)  # the next tick

    batch = prewarmed(40)
    assert (batch.desired, batch.reason) == (2, "prewarm")
    idle = dataclasses.replace(NONE.idle, prewarm_s=570.0, keepalive_s=612.0, wake_requests=40.0)
    idle = dataclasses.replace(idle, representative=True)
    assert keepalive_levels(idle, POLICY, 30.0, SERVICE_S) == [612.0, 612.0]
    single = prewarmed(1)
    assert (single.desired, single.reason) == (1, "prewarm")


def test_keepalive_from_the_histogram_for_short_gaps() -> None:
    rng = random.Random(3)
    history, t = ArrivalHistory(), T0
    for _ in range(200):
        t += rng.uniform(20, 55)  # a caller every 20–55 s: keep the worker through the gaps
        history.record(t)
    models = refit(history.stats(t + 1), POLICY, 30.0, SERVICE_S)
    longest = max(history.stats(t + 1).gaps)
    assert models.idle.prewarm_s is None and models.idle.keepalive_s > longest
    s = state(ready=1, last_arrival_at=t, models=models)
    d = run(s, t + 50)
    assert (d.desired, d.reason) == (1, "keepalive")
    assert run(s, t + models.idle.keepalive_s + 1).desired == 0


def test_stale_models_are_ignored() -> None:
    models, last = periodic_models(900, 15, 40, 30)
    old = dataclasses.replace(models, fitted_at=last - 10_000)
    boot_at = last + (models.idle.prewarm_s or 0) - 30 - MAX_TICK_S
    assert run(state(last_arrival_at=last, models=old), boot_at).desired == 0


def ramp_models(now: float) -> Models:
    """Arrivals per 10 s bucket rising from 2 to 60 over ten minutes."""
    history = ArrivalHistory()
    for b in range(60):
        start = now - 600 + b * 10
        n = 2 + b
        for i in range(n):
            history.record(start + 10 * i / n)
    return refit(history.stats(now), POLICY, 30.0, SERVICE_S)


def test_forecast_provisions_ahead_of_a_rising_ramp() -> None:
    models = ramp_models(T0)
    assert models.forecast is not None
    mean_now, _ = models.forecast.rate(T0)
    mean_later, _ = models.forecast.rate(T0 + 30)
    assert mean_later > mean_now > 5  # per second
    # demand right now fits in the ready workers; the forecast asks for more before it arrives
    d = run(forecast_state(), T0)
    assert d.reason == "forecast" and d.desired > 3


def forecast_state() -> DeploymentState:
    """Three full workers ahead of a rising ramp."""
    return state(
        ready=3,
        running=4 * 3,
        stable_concurrency=12,
        panic_concurrency=12,
        last_arrival_at=T0,
        service_s=2.0,
        models=ramp_models(T0),
    )


def test_crash_loop_gates_starts_and_fails_waiting_jobs() -> None:
    d = run(state(queued=2, start_allowed=False, last_arrival_at=T0), T0)
    assert (d.desired, d.start, d.reason, d.fail_waiting) == (0, 0, "crash_backoff", False)
    d = run(state(queued=2, start_allowed=False, give_up=True, last_arrival_at=T0), T0)
    assert (d.desired, d.reason, d.fail_waiting) == (0, "crash_loop", True)
    # a crash-looping version still scales down what it has
    d = run(state(ready=2, give_up=True, last_arrival_at=T0 - 10_000), T0)
    assert d.desired == 1 and not d.fail_waiting


def test_decide_is_pure() -> None:
    s = state(
        queued=3,
        ready=1,
        running=2,
        stable_concurrency=6,
        panic_concurrency=9,
        last_arrival_at=T0,
        models=ramp_models(T0),
        memory=Memory(Levels((T0 - 5,) * 3), 0.0),
    )
    assert decide(s, T0 + 1) == decide(s, T0 + 1)


def test_concurrency_window_averages() -> None:
    w = ConcurrencyWindow()
    for i in range(60):
        w.record(T0 + i, 10.0 if i >= 57 else 0.0)
    stable, panic = w.averages(T0 + 59)
    assert stable == pytest.approx(0.5)
    assert panic == pytest.approx(5.0)
    assert NONE.forecast is None


def test_keepalive_counts_from_the_end_of_a_long_job() -> None:
    hold = POLICY.scaledown_window_s
    # a job that arrived long ago runs until now: its worker is kept a full window after it
    running = run(state(ready=1, running=1, last_arrival_at=T0 - 5 * hold), T0)
    done = state(ready=1, last_arrival_at=T0 - 5 * hold, memory=running.memory)
    assert run(done, T0 + hold - 1).reason == "keepalive"
    assert run(done, T0 + hold + 1).desired == 0


def test_a_quiet_deployment_called_in_bursts_keeps_the_workers_its_next_wake_wants() -> None:
    """A wake brings 120 callers within a boot. A ready worker starts 4 at once and 4 more
    every 5 s, 28 over a 30 s boot: the wake wants 5 workers, the fifth for 8 callers."""
    idle = IdleWindows(None, 0.0, representative=False, wake_requests=120.0)
    window = hold_s(POLICY, 30.0, 120.0)  # the last worker's: capped by the scale-down window
    levels = wake_levels(idle, POLICY, 30.0, SERVICE_S, window)
    assert levels == [window] * 4 + [hold_s(POLICY, 30.0, 8.0)]
    assert hold_s(POLICY, 30.0, 8.0) < window  # 30 + 8 × 60 s
    # a sparse deployment's wake brings one caller: one worker, as the plain window keeps
    one = dataclasses.replace(idle, wake_requests=1.0)
    assert wake_levels(one, POLICY, 30.0, SERVICE_S, 90.0) == [90.0]

    models = Models(T0, None, idle)
    quiet = state(ready=8, last_arrival_at=T0, models=models, memory=Memory(busy_at=T0))
    # the burst is over: from 8 workers down to the 5 the next wake wants
    assert (run(quiet, T0 + 100).desired, run(quiet, T0 + 100).reason) == (5, "scale_down")
    kept = run(dataclasses.replace(quiet, ready=5), T0 + 100)
    assert (kept.desired, kept.reason) == (5, "keepalive")
    # the fifth goes when its own window ends, the other four with the last one's
    assert run(quiet, T0 + hold_s(POLICY, 30.0, 8.0) + 1).needed == 4
    assert run(quiet, T0 + window + 1).needed == 0
    # and while work runs too: the first calls of a wake come before its queue does (released
    # at the wake's first tick, they were booted again for its queue)
    wake = dataclasses.replace(quiet, ready=5, running=4, last_arrival_at=T0 + 300)
    assert (run(wake, T0 + 300).desired, run(wake, T0 + 300).reason) == (5, "keepalive")


def test_the_workers_a_wake_wants_are_priced_by_the_wakes_seen_not_their_mean() -> None:
    """A worker ready at a wake serves 4 × (1 + 30 / 5) = 28 of its callers over a boot. Wakes
    of 20 and 100 callers: at their mean (60), a second worker for 28 callers and a third for
    4; over the wakes themselves, the large one wants three more workers, each priced by its
    share: 28 / 2, 28 / 2 and 16 / 2 callers a wake."""
    mean_only = IdleWindows(None, 0.0, representative=False, wake_requests=60.0)
    assert wake_callers(mean_only, POLICY, 30.0, SERVICE_S) == [28.0, 4.0]
    seen = dataclasses.replace(mean_only, wakes=(20.0, 100.0))
    assert wake_callers(seen, POLICY, 30.0, SERVICE_S) == [14.0, 14.0, 8.0]
    window = POLICY.scaledown_window_s
    assert wake_levels(seen, POLICY, 30.0, SERVICE_S, window) == [window] + [
        min(hold_s(POLICY, 30.0, c), window) for c in (14.0, 14.0, 8.0)
    ]


def test_the_workers_kept_for_the_next_wake_are_not_held_again_after_it() -> None:
    """Four workers' work, still there a boot later (its levels priced by 4 callers: a 270 s
    hold), then quiet: the next wake wants 5 workers, kept for the window from the end of the
    work. Once the window ends they go; the levels' holds, which ran from the end of the work
    too, do not start again after the keep-alive."""
    idle = IdleWindows(None, 0.0, representative=False, wake_requests=120.0)
    models = Models(T0 + 30, None, idle)  # fitted after the last arrival: current
    busy = state(ready=4, running=16, last_arrival_at=T0, models=models)
    memory = run(busy, T0).memory
    memory = run(dataclasses.replace(busy, memory=memory), T0 + 30).memory
    quiet = state(ready=5, last_arrival_at=T0 + 30, models=models, memory=memory)
    window = POLICY.scaledown_window_s
    t = T0 + 30
    while t < T0 + 30 + window + 10:
        t += 2.0
        d = run(quiet, t)
        quiet = dataclasses.replace(quiet, memory=d.memory)
        if t < T0 + 30 + hold_s(POLICY, 30.0, 8.0):
            assert d.desired == 5
    assert d.needed == 0 and d.desired == 2  # halved: the reconciler drains what goes

"""`decide()` as pure logic, on a fake clock (plain floats): the parts driven by the work present
(demand, panic, the stable window, what may wait, the backlog of booting workers), the bounds,
the crash-loop gate, and that it is pure. The idle-time parts are test_scaling_decide_idle.py."""

from __future__ import annotations

import dataclasses
import math

import pytest

from control_plane.domain.scaling import (
    ArrivalHistory,
    ConcurrencyWindow,
    Memory,
    decide,
    refit,
)
from control_plane.domain.scaling.backlog import backlog_workers
from control_plane.domain.scaling.idle import PLAIN
from control_plane.domain.scaling.levels import NO_FIT, Levels, level_fit
from control_plane.domain.scaling.models import NONE, Models
from control_plane.domain.scaling.policy import waits_allowed
from tests.unit.scaling_states import (
    POLICY,
    SERVICE_S,
    T0,
    WAITING,
    forecast_state,
    periodic_models,
    ramp_models,
    run,
    state,
)


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


def test_the_memory_keeps_when_the_queue_was_last_empty() -> None:
    # how long the jobs queued now have been building: what a level priced at its need
    # would have found served by the workers below it, had they been held (`levels.py`)
    d = run(state(ready=1, running=2, last_arrival_at=T0), T0)
    assert d.memory.unqueued_at == T0
    queued = state(queued=9, ready=1, running=4, last_arrival_at=T0 + 4, memory=d.memory)
    d = run(queued, T0 + 4)
    assert d.memory.unqueued_at == T0
    d = run(dataclasses.replace(queued, memory=d.memory), T0 + 6)
    assert d.memory.unqueued_at == T0


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


def test_once_no_work_is_present_the_windows_leave_the_workers_to_their_holds() -> None:
    # panic for a burst whose work ended at once: its workers are held for their levels' holds
    # (a boot from their need, at no caller's price), not for the rest of the panic window nor
    # for the stable window's memory of the burst
    d = run(state(ready=1, running=4, stable_concurrency=4, panic_concurrency=12), T0)
    assert (d.desired, d.reason) == (3, "panic")
    quiet = state(ready=3, stable_concurrency=4.0, panic_concurrency=12.0, last_arrival_at=T0)
    d2 = run(dataclasses.replace(quiet, memory=d.memory), T0 + 20)
    assert (d2.desired, d2.reason) == (3, "hold")
    # a boot after their need, no fewer than 3 / 2 rounded down
    d3 = run(dataclasses.replace(quiet, memory=d2.memory), T0 + 31)
    assert (d3.desired, d3.reason) == (1, "scale_down")
    # a job present again: the panic window still rules
    busy = dataclasses.replace(quiet, running=1, memory=d3.memory)
    assert run(busy, T0 + 33).reason == "panic"


def test_no_ready_worker_is_released_while_another_boots() -> None:
    # the same burst, its holds run out while two of its workers still boot: a scale-down
    # would stop the idle ready worker first (`plans/scale.py`), and the next call would wait
    # for a boot; the booting ones are released once ready
    d = run(state(ready=1, running=4, stable_concurrency=4, panic_concurrency=12), T0)
    booting = state(ready=1, booting_since=(T0, T0), last_arrival_at=T0, memory=d.memory)
    d1 = run(booting, T0 + 31)
    assert (d1.desired, d1.capacity, d1.reason) == (3, 3, "hold")
    ready = dataclasses.replace(booting, ready=3, booting_since=(), memory=d1.memory)
    assert run(ready, T0 + 33).desired == 1
    # with no ready worker to lose, the booting ones go as before
    lone = state(booting_since=(T0, T0), last_arrival_at=T0, memory=d.memory)
    assert run(lone, T0 + 31).reason == "scale_down"


def _quiet_ticks(memory: Memory, peak: int, until: float) -> list[tuple[int, str]]:
    """Ticks every 2 s after T0 with 3 workers ready and no work present at any tick, and
    `peak` jobs present at an arrival between each two (served before the next tick)."""
    out, t = [], T0
    while t < until:
        t += 2.0
        s = state(ready=3, last_arrival_at=t - 1.0, peak_demand=peak, memory=memory)
        d = run(s, t)
        out.append((d.desired, d.reason))
        memory = d.memory
    return out


def test_work_that_fills_the_workers_between_ticks_renews_their_levels() -> None:
    d = run(state(ready=3, running=12), T0)
    assert (d.desired, d.reason) == (3, "demand")
    # bursts of 12 jobs served between the ticks: the three workers stay, as a keep-alive
    # whose clock restarts at every call keeps them
    assert set(_quiet_ticks(d.memory, 12, T0 + 120)) == {(3, "hold")}
    # seen at the ticks alone, the same quiet goes down once the levels' holds run out
    assert (1, "scale_down") in _quiet_ticks(d.memory, 0, T0 + 120)
    # a peak of 6 jobs fills two workers: the third is released
    assert (2, "scale_down") in _quiet_ticks(d.memory, 6, T0 + 120)
    # a peak beyond the workers present starts none (the parts driven by the work do)
    assert max(n for n, _ in _quiet_ticks(d.memory, 40, T0 + 120)) == 3


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
    # with nothing booting and neither a stream's rate nor a pre-warm plan, the queue is all
    # there is: the demand part boots for it (the levels learn from the bursts those serve)
    ready = dataclasses.replace(calm, booting_since=(), ready=2, running=8)
    d = run(ready, T0)
    assert (d.desired, d.start, d.backlog_workers) == (5, 3, None)  # ceil(18 / 4)


def test_a_swing_the_ready_workers_absorb_within_a_boot_boots_none() -> None:
    # a stream of 0.4 calls/s (forecast fitted): 2 ready workers, every slot busy, 2 queued.
    # They start 2 × 4 slots × 30 s / 5 s = 48 jobs over a boot; 2 + 12 arrive: none needed then
    history = ArrivalHistory()
    for i in range(1800):
        history.record(T0 - 1800 + i * 2.5)
    stream = refit(history.stats(T0), POLICY, 30.0, SERVICE_S)
    assert stream.forecast is not None
    swing = state(ready=2, running=8, queued=2, last_arrival_at=T0, models=stream)
    d = run(swing, T0)
    assert (d.desired, d.start, d.backlog_workers) == (2, 0, 0)
    # the same queue with no rate known boots a worker for it
    assert run(dataclasses.replace(swing, models=NONE), T0).start == 1

    # ... as does a third level that the past keeps from one need to the next (needed again
    # 40-50 s after each need, within its 150 s hold, released 200 s ago): booted now, it is
    # there for the next swing
    def third(*gaps: float) -> Memory:
        fit = level_fit(gaps, 150.0, (2.0, 2.0, 2.0))
        return Memory(Levels((T0 - 5, T0 - 5, T0 - 200), (NO_FIT, NO_FIT, fit), (None,) * 3))

    d = run(dataclasses.replace(swing, memory=third(40.0, 50.0, 45.0)), T0)
    assert (d.desired, d.start, d.backlog_workers) == (3, 1, 1)
    # one needed again within its hold less often than not is not
    d = run(dataclasses.replace(swing, memory=third(40.0, 400.0, math.inf)), T0)
    assert (d.desired, d.start, d.backlog_workers) == (2, 0, 0)
    # a faster stream would leave jobs waiting at the boot's end: the part's own count applies
    fast = dataclasses.replace(swing, queued=40, panic_concurrency=48.0)
    d = run(fast, T0)
    assert d.backlog_workers is not None and d.start >= 1


def test_a_batch_on_its_prewarmed_workers_boots_none_it_would_not_serve() -> None:
    # a 5-minute cron job on its pre-warm plan: the batch's 10 calls on the 2 workers ready for
    # it start within a service time, long before a worker started now could be ready
    models, last = periodic_models(300, 3, 30, 30.0)
    assert models.idle.prewarms
    batch = state(ready=2, running=8, queued=2, last_arrival_at=last + 1, models=models)
    d = run(batch, last + 1)
    assert (d.start, d.backlog_workers) == (0, 0)
    # off the plan (the idle windows not yet representative), the queue boots one as before
    plain = dataclasses.replace(models, idle=PLAIN)
    assert run(dataclasses.replace(batch, models=plain), last + 1).start == 1


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


def test_forecast_provisions_ahead_of_a_rising_ramp() -> None:
    models = ramp_models(T0)
    assert models.forecast is not None
    mean_now, _ = models.forecast.rate(T0)
    mean_later, _ = models.forecast.rate(T0 + 30)
    assert mean_later > mean_now > 5  # per second
    # demand right now fits in the ready workers; the forecast asks for more before it arrives
    d = run(forecast_state(), T0)
    assert d.reason == "forecast" and d.desired > 3


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

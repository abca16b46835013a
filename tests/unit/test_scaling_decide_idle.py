"""`decide()` on idle time: holds of the workers above the last, the last worker's window, the
idle windows' keep-alive and pre-warm, and the workers a wake wants."""

from __future__ import annotations

import dataclasses
import random

import pytest

from control_plane.domain.scaling import (
    ArrivalHistory,
    Memory,
    ScaleDecision,
    refit,
)
from control_plane.domain.scaling.decide import (
    MAX_TICK_S,
    keepalive_levels,
    wake_callers,
)
from control_plane.domain.scaling.idle import IdleWindows
from control_plane.domain.scaling.models import NONE, Models
from control_plane.domain.scaling.policy import hold_s
from control_plane.domain.scaling.wake import wake_levels, wake_workers
from tests.unit.scaling_states import (
    POLICY,
    SERVICE_S,
    T0,
    periodic_models,
    run,
    state,
)


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
    # three workers' slots full for 40 s every 400 s, two workers' worth between: without
    # the third worker, its 4 jobs would queue through a boot into each swing and the
    # arrivals it serves would pile up behind them (`episode.py`), a cold start worth more
    # than the window: it is held through the swings, 360 s apart, and for the window after
    # the last (`levels.py`)
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
    assert run(calm, last + 362.0).reason == "hold"
    assert run(calm, last + POLICY.scaledown_window_s - 2).reason == "hold"
    d = run(calm, last + POLICY.scaledown_window_s + 2)
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


def test_on_a_prewarm_plan_held_workers_wait_for_the_prewarm_unless_a_miss_costs_more() -> None:
    """Four workers' work for a boot (each level priced by the callers it spared), then quiet
    on a pre-warm plan: the next call is not expected before the pre-warm is ready, so the
    workers the levels hold are released at the end of the work and booted again with the
    pre-warm, unless a call before it is likely enough (few pauses seen) that a level's cold
    start, at that chance, costs more than the idle seconds released."""
    policy = dataclasses.replace(POLICY, cold_penalty_s=600.0)
    busy = state(policy=policy, ready=4, running=16, last_arrival_at=T0)
    memory = run(busy, T0).memory
    memory = run(dataclasses.replace(busy, memory=memory), T0 + 30).memory

    def quiet(pauses: int, t: float) -> ScaleDecision:
        idle = IdleWindows(500.0, 620.0, representative=True, idle_gaps=pauses)
        models = Models(t, None, idle)
        s = state(policy=policy, ready=4, last_arrival_at=T0 + 30, models=models, memory=memory)
        return run(s, t)

    released = quiet(30, T0 + 32)
    assert released.needed == 0 and released.desired == 2  # halved: the reconciler drains
    assert released.next_prewarm_at == pytest.approx(T0 + 30 + 500 - 30 - MAX_TICK_S)
    kept = quiet(0, T0 + 32)
    assert (kept.desired, kept.reason) == (4, "hold")
    # at the pre-warm, the workers the holds still keep are booted again
    boot_at = T0 + 30 + 500 - 30 - MAX_TICK_S
    warm = quiet(30, boot_at + 1)
    assert (warm.desired, warm.reason) == (4, "hold")


def test_the_workers_kept_for_the_next_wake_are_counted_without_pricing_them_while_busy() -> None:
    # `wake_workers` skips the levels' prices within a boot of the last work (each is kept at
    # least that long): the count is the one the priced levels give, at every moment
    rng = random.Random(7)
    for _ in range(400):
        policy = dataclasses.replace(
            POLICY,
            max_workers=rng.choice([0, 1, 3, 8, 40]),
            target_concurrency=rng.choice([1, 4, 8]),
            scaledown_window_s=rng.choice([10.0, 60.0, 600.0]),
            cold_penalty_s=rng.choice([0.0, 60.0, 600.0]),
        )
        wakes = tuple(float(rng.randint(1, 400)) for _ in range(rng.randint(0, 6)))
        idle = IdleWindows(None, 300.0, True, wake_requests=rng.uniform(1, 50), wakes=wakes)
        boot_s, service_s = rng.choice([5.0, 30.0, 84.0]), rng.uniform(0.5, 20.0)
        window_s = rng.choice([20.0, 300.0, 600.0])
        for idle_for in (0.0, rng.uniform(0, boot_s), rng.uniform(0, window_s)):
            levels = wake_levels(idle, policy, boot_s, service_s, window_s)
            expected = sum(1 for w in levels if idle_for < w)
            assert wake_workers(idle, policy, boot_s, service_s, window_s, idle_for) == expected

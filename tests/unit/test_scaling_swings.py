"""A steady stream's swings: the forecast tells a Poisson stream at a steady rate from one
whose counts scatter more (`Forecast.steady`), and on such a stream the levels that its swings
alone needed are released once their need has passed (`levels.kept_on_steady_stream`), in
`decide` too."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime

import pytest

from control_plane.api.responses import ScalingStatus
from control_plane.domain.plans.scale import document
from control_plane.domain.scaling import ArrivalHistory, Memory, refit
from control_plane.domain.scaling.forecast import fit_forecast
from control_plane.domain.scaling.levels import (
    NO_FIT,
    NO_LEVELS,
    NOT_AGAIN,
    Levels,
    kept_on_steady_stream,
    level_fit,
)
from control_plane.domain.scaling.models import Models, steady_buckets
from tests.unit.scaling_level_steps import BOOT_S, SHORT_BURST_CALLERS, TICK_S, burst, poisson, step
from tests.unit.scaling_states import POLICY, SERVICE_S, T0, run, state


def poisson_stream(seed: int, rate: float) -> Models:
    """The models refit on half an hour of a Poisson stream of `rate` calls/s up to T0."""
    rng = random.Random(seed)
    history, t = ArrivalHistory(), T0 - 1800
    while t < T0:
        t += rng.expovariate(rate)
        history.record(t)
    return refit(history.stats(T0), POLICY, 30.0, SERVICE_S)


def test_a_poisson_stream_is_steady_and_batches_bursts_and_a_switch_are_not() -> None:
    rng = random.Random(2)
    for mean in (2.0, 20.0, 100.0):  # 0.2 to 10 calls a second
        counts = [poisson(rng, mean) for _ in range(180)]
        fc = fit_forecast(counts, T0)
        assert fc is not None and fc.steady, mean
        # ... judged on the scale-down window at least: five minutes of it say too little
        assert steady_buckets(POLICY) == 60
        fc = fit_forecast(counts[:59], T0, steady_buckets(POLICY))
        assert fc is not None and not fc.steady
        fc = fit_forecast(counts[:60], T0, steady_buckets(POLICY))
        assert fc is not None and fc.steady
    # 200 calls a minute in one bucket: the level stays put, but the counts scatter far more
    # than Poisson counts do
    batches = [200.0 if i % 6 == 0 else 0.0 for i in range(180)]
    # bursts of a minute at 4 calls a second after a minute of silence
    bursts = [poisson(rng, 40) if i // 6 % 2 else 0.0 for i in range(180)]
    # a stream that switches from 1 to 5 calls a second halfway
    switch = [poisson(rng, 10 if i < 90 else 50) for i in range(180)]
    for counts in (batches, bursts, switch):
        fc = fit_forecast(counts, T0)
        assert fc is not None and not fc.steady


def test_on_a_steady_stream_a_level_its_swings_alone_needed_is_released_after_a_boot() -> None:
    window = POLICY.scaledown_window_s
    # a swing needs three workers for 10 s, then two until a boot after it (`burst`)
    levels, ended = burst(NO_LEVELS, T0, 10.0)
    assert levels.fits[2].cold_callers == pytest.approx(SHORT_BURST_CALLERS)
    now = ended + BOOT_S + TICK_S
    levels, held = step(levels, 1, now, 4.0)
    assert held == 3  # each held for its price
    # the third's need is past by a boot; the second's is not: a release within a boot of its
    # need saves less than a need again would cost
    assert kept_on_steady_stream(levels, held, 1, now, BOOT_S, window) == 2
    later = T0 + 2 * BOOT_S + TICK_S
    levels, held = step(levels, 1, later, 4.0)
    assert held == 3
    assert kept_on_steady_stream(levels, held, 1, later, BOOT_S, window) == 1
    # never below the work's own need
    assert kept_on_steady_stream(levels, held, 2, later, BOOT_S, window) == 2


def test_on_a_steady_stream_a_level_needed_again_within_the_window_keeps_its_hold() -> None:
    window = POLICY.scaledown_window_s
    levels = NO_LEVELS
    held, now = 0, 0.0
    for at in (T0, T0 + 200.0):  # the same swing (`burst`), again 200 s later
        levels, ended = burst(levels, at, 10.0)
        now = ended + 2 * BOOT_S
        levels, held = step(levels, 1, now, 4.0)
        assert held == 3
        # released after the first swing; its next need counts the gap all the same
        kept = kept_on_steady_stream(levels, held, 1, now, BOOT_S, window)
        assert kept == (1 if at == T0 else 3)
    # the third worker last needed 10 s into the swing, the second until a boot after it
    assert levels.fits[2].gaps == (190.0,) and levels.fits[1].gaps == (170.0,)
    # a gap past the window says nothing of a need within it
    fits = (NO_FIT, level_fit((NOT_AGAIN,)), level_fit((NOT_AGAIN,)))
    far = levels._replace(fits=fits)
    assert kept_on_steady_stream(far, held, 1, now, BOOT_S, window) == 1


def test_on_a_steady_stream_the_workers_a_swing_needed_go_once_it_has_passed() -> None:
    # a Poisson stream of 0.4 calls/s; a swing needed three workers 40 s ago, each level priced
    # at two callers (held 150 s)
    stream = poisson_stream(3, 0.4)
    assert stream.forecast is not None and stream.forecast.steady
    fit = level_fit((), 0.0, (2.0,))
    swung = Memory(Levels((T0 - 40,) * 3, (NO_FIT, fit, fit), (None,) * 3))
    after = state(ready=3, running=2, last_arrival_at=T0, models=stream, memory=swung)
    d = run(after, T0)
    # the forecast part sized the stream's swings: the workers above it go (at most half a
    # tick); the levels remember the need (its gap counts at the next)
    assert d.needed < 3 and d.reason == "scale_down"
    assert d.desired == max(d.needed, 1)
    assert d.memory.levels.needed_at[1:] == (T0 - 40, T0 - 40)
    # the same swing on a stream whose counts scatter more than Poisson ones: held
    bursty = dataclasses.replace(stream.forecast, steady=False)
    d = run(dataclasses.replace(after, models=dataclasses.replace(stream, forecast=bursty)), T0)
    assert (d.desired, d.reason) == (3, "hold")


def test_the_decision_as_the_api_shows_it_says_whether_the_stream_is_steady() -> None:
    s = state(ready=1, running=2, last_arrival_at=T0, models=poisson_stream(4, 0.4))
    now = datetime.fromtimestamp(T0, UTC)
    shown = ScalingStatus.model_validate(document(s, run(s, T0), now))
    assert shown.forecast is not None and shown.forecast.steady
    assert shown.forecast.rate_per_s == pytest.approx(0.4, rel=0.3)

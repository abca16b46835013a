"""The autoscaler's slow half: arrival history, the forecaster, the idle windows and the
measured service time."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from control_plane.domain.scaling.forecast import MIN_BUCKETS, fit_forecast
from control_plane.domain.scaling.history import (
    BUCKET_S,
    IDLE_GAP_S,
    MAX_BUCKETS,
    MAX_GAPS,
    MAX_IDLE_GAPS,
    ArrivalHistory,
    ArrivalStats,
    merged_gaps,
    stats_of,
)
from control_plane.domain.scaling.idle import (
    MIN_GAPS,
    PLAIN,
    WAKES_KEPT,
    _Spread,
    fit_idle_windows,
    wake_requests,
    wake_sizes,
)
from control_plane.domain.scaling.models import refit
from control_plane.domain.scaling.policy import ScalingPolicy
from control_plane.domain.scaling.service import (
    MAX_SAMPLES,
    MIN_SAMPLES,
    SERVICE_WINDOW_S,
    mean_service_s,
)
from tests.unit.scaling_level_steps import poisson

T0 = 1_000_000.0


def test_history_is_bounded_and_counts_complete_buckets_only() -> None:
    h = ArrivalHistory()
    for i in range(10_000):
        h.record(T0 + i * 0.9)
    now = T0 + 9_000.5
    stats = h.stats(now)
    assert len(stats.counts) == MAX_BUCKETS
    assert len(stats.gaps) == MAX_GAPS
    assert stats.gaps[-1] == pytest.approx(0.9)
    assert stats.buckets_end_at == (now // BUCKET_S) * BUCKET_S
    assert sum(stats.counts) == pytest.approx(MAX_BUCKETS * BUCKET_S / 0.9, rel=0.01)


def test_simultaneous_arrivals_are_gaps_of_zero() -> None:
    h = ArrivalHistory()
    h.record(T0)
    h.record(T0 + 5, n=3)
    assert h.stats(T0 + 20).gaps == (5.0, 0.0, 0.0)


def test_stats_of_fills_empty_buckets_with_zero() -> None:
    stats = stats_of({100: 4, 103: 1}, (1.0, 2.0), (), 1035.0, now=104 * BUCKET_S + 3)
    assert stats.counts == (4.0, 0.0, 0.0, 1.0)
    assert stats.last_arrival_at == 1035.0


def test_no_forecast_without_history_or_traffic() -> None:
    assert fit_forecast([3.0] * (MIN_BUCKETS - 1), T0) is None
    assert fit_forecast([0.0] * 100, T0) is None


def test_forecast_follows_a_step_and_a_ramp() -> None:
    rng = random.Random(1)
    steady = [poisson(rng, 20) for _ in range(120)]
    fc = fit_forecast(steady, T0)
    assert fc is not None
    mean, sd = fc.rate(T0 + 30)
    assert mean == pytest.approx(2.0, rel=0.2)  # 20 per 10 s bucket
    assert sd < 0.5
    ramp = [poisson(rng, 5 + i) for i in range(60)]
    fc = fit_forecast(ramp, T0)
    assert fc is not None and fc.slope > 0.5
    assert fc.rate(T0 + 60)[0] > fc.rate(T0)[0] > 5.0
    # ... and so for calls longer than a bucket too
    for counts in (steady, ramp):
        assert fit_forecast(counts, T0, service_s=40.0) == fit_forecast(counts, T0)


def test_for_calls_longer_than_a_bucket_the_rate_is_not_the_last_batchs() -> None:
    # a batch of 30 calls (at 50 calls/s) every minute, each moved by up to ±9 s: 0.5 calls/s
    rng = random.Random(3)
    counts = [0.0] * 150
    for k in range(25):
        t = 30.0 + 60 * k + rng.uniform(-9.0, 9.0)
        for _ in range(30):
            counts[int(t // BUCKET_S)] += 1
            t += rng.expovariate(50.0)
    # the fits right after each bucket that held most of a batch
    ends = [i + 1 for i in range(30, 150) if counts[i] >= 15]
    followed = 0
    for end in ends:
        history = counts[max(0, end - 120) : end]
        short, long = (fit_forecast(history, T0, service_s=s) for s in (4.5, 40.0))
        assert short is not None and long is not None
        # calls of a bucket or shorter: as before, as the bucket's counts say
        assert fit_forecast(history, T0) == short == fit_forecast(history, T0, service_s=10.0)
        followed += short.rate(T0)[0] > 2.0
        # 40 s calls are concurrent with those of four buckets: the rate across them (0.5
        # calls/s, 0.75 over the last 40 s), less than half the batch's bucket's
        mean, sd = long.rate(T0)
        assert mean < 1.2 and sd < 0.7
        if end >= 90:  # with a quarter of an hour of history
            assert 0.5 < mean < 0.8 and sd < 0.35
        assert not long.steady  # its counts scatter far more than Poisson ones
    assert len(ends) > 15 and followed  # (the short fits followed a batch's bucket at times)


def test_idle_windows_need_enough_gaps() -> None:
    rng = random.Random(1)
    irregular = [rng.expovariate(1 / 900) + 60 for _ in range(MIN_GAPS - 1)]
    assert fit_idle_windows(irregular, 30, 300, 600) == PLAIN
    assert fit_idle_windows([*irregular, 900.0], 30, 300, 600).representative


def test_a_few_gaps_that_agree_within_the_margins_are_a_period() -> None:
    assert fit_idle_windows([900.0, 930.0, 880.0], 30, 300, 600).representative
    assert fit_idle_windows([900.0, 930.0], 30, 300, 600) == PLAIN  # two agree too often
    assert fit_idle_windows([700.0, 930.0, 880.0], 30, 300, 600) == PLAIN  # 930 > 700 × 1.1 / 0.9


def test_only_idle_gaps_count() -> None:
    """A burst's 250 calls a second apart, then one pause of 9 minutes: the calls came while
    the worker served the last one, so there is one idle gap, too few to fit a pre-warm on."""
    gaps = [1.0] * 250 + [540.0]
    assert fit_idle_windows(gaps, 30, 60, 600, wake=60.0, busy_s=4.0) == dataclasses.replace(
        PLAIN, wake_requests=60.0
    )


def test_one_burst_of_arrivals_is_not_a_history_of_idle_times() -> None:
    # 24 calls 10 ms apart: many gaps, but 0.23 s of them, against windows of up to 60 s
    burst = [0.01] * 23
    assert fit_idle_windows(burst, 7.5, 60, 60) == PLAIN
    # the same count spread over more than the window is one
    assert fit_idle_windows([3.0] * 23, 7.5, 60, 60).representative


def test_periodic_gaps_prewarm_just_before_the_period() -> None:
    rng = random.Random(2)
    gaps = [900 + rng.uniform(-15, 15) for _ in range(100)]
    w = fit_idle_windows(gaps, 30, 300, 600)
    assert w.representative and w.prewarm_s is not None
    assert min(gaps) * 0.9 <= w.prewarm_s <= min(gaps)  # ready before (nearly) every arrival
    assert w.keepalive_s > max(gaps)  # and kept until past the latest one
    assert w.keepalive_s - (w.prewarm_s - 30) <= 600  # a pre-warmed worker lives ≤ the window


def test_a_fit_knows_how_many_pauses_it_saw() -> None:
    """The chance that the next pause is shorter than every one seen: of n + 1 exchangeable
    pauses, the next is the shortest one time in n + 1 (what a held worker's release weighs)."""
    rng = random.Random(3)
    gaps = [rng.uniform(280, 320) for _ in range(30)]
    w = fit_idle_windows(gaps, 30, 600, 600, busy_s=5)
    assert w.prewarms
    assert (w.idle_gaps, w.shorter_chance) == (30, pytest.approx(1 / 31))


def test_calls_that_come_together_do_not_hide_the_period() -> None:
    """A cron job firing three calls 0.2 s apart every four minutes: its short gaps come while
    the worker still serves the first call, so they cost no cold start even if the worker is
    released between firings, and the period gets its pre-warm."""
    rng = random.Random(6)
    gaps: list[float] = []
    for _ in range(12):
        gaps += [0.2, 0.2, 240 + rng.uniform(-12, 12)]
    w = fit_idle_windows(gaps, 30, 60, 600, wake=3.0, busy_s=3.5)
    assert w.representative and w.prewarm_s is not None
    first = min(g for g in gaps if g > 1)  # the shortest period
    assert 0.85 * first <= w.prewarm_s <= first < w.keepalive_s  # ready for each firing
    # counted as if each short gap released the worker, no pre-warm is as warm as the window:
    # the worker is kept the whole window after each firing
    blind = fit_idle_windows(gaps, 30, 60, 600, wake=3.0)
    assert blind.prewarm_s is None and blind.keepalive_s == 600


def test_memoryless_long_gaps_keep_the_window_s_keep_alive() -> None:
    """An hour between callers on average: at a 390 s cold start, releasing at once would cost
    less than keeping the worker, but every call that comes within the window would be cold
    where the window's keep-alive serves it warm (one in six). Nothing in a memoryless past
    says which ones: kept for the window."""
    rng = random.Random(3)
    gaps = [rng.expovariate(1 / 3600) for _ in range(200)]
    w = fit_idle_windows(gaps, 30, 300, 600)
    assert w.representative and w.keepalive_s >= 600 and w.prewarm_s is None


def test_short_gaps_keep_the_worker_through_them() -> None:
    rng = random.Random(4)
    gaps = [rng.uniform(20, 90) for _ in range(200)]
    w = fit_idle_windows(gaps, 30, 300, 600)
    assert w.prewarm_s is None and w.keepalive_s >= max(gaps)


def test_a_new_longest_gap_within_the_window_finds_the_worker_kept() -> None:
    """How much longer than any seen the next longest gap is, nothing seen says: up to the
    window it is one the window's keep-alive catches, so the worker is kept the window, not
    just past the longest gap seen (where every new record was a cold call)."""
    rng = random.Random(4)
    gaps = [rng.uniform(20, 90) for _ in range(200)]
    assert fit_idle_windows(gaps, 30, 300, 600).keepalive_s == 600


def test_a_plan_may_not_trade_calls_the_window_catches_for_longer_pauses() -> None:
    """13 pauses after bursts: three within the window, the rest up to half an hour, four of
    them at 1,800 s. Pre-warming for 1,800 s catches those four and misses the three (as many
    cold calls, counted): never chosen, since each of the three would have found the window's
    keep-alive. A pre-warm ready before the shortest pause, kept past the window, is."""
    pauses = [288.8, 331.9, 386.9, 720.6, 721.0, 952.9, 995.9, 1051.4, 1784.1] + [1800.0] * 4
    w = fit_idle_windows([0.5] * 100 + pauses, 30, 60, 600, wake=13.0, busy_s=3.6)
    assert w.representative
    assert w.prewarm_s is None or w.prewarm_s <= 288.8 * 0.9
    assert w.keepalive_s >= 600


def test_the_keepalive_never_passes_the_scaledown_window() -> None:
    gaps = [400.0 + i for i in range(50)]
    w = fit_idle_windows(gaps, 30, 300, 120)
    assert w.prewarm_s is not None or w.keepalive_s <= 120
    if w.prewarm_s is not None:
        assert w.keepalive_s - (w.prewarm_s - 30) <= 120


def test_a_wake_catches_one_caller_of_a_sparse_deployment_and_a_boot_s_worth_of_a_burst() -> None:
    # 30 s boots cover 3 buckets; wakes are buckets with arrivals after 3 empty ones
    sparse = [0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    assert wake_requests(sparse, 30) == 1.0
    # bursts of 20 calls a bucket: each wake catches the 3 buckets a boot covers, 60 callers
    bursty = ([0] * 30 + [20] * 12) * 3
    assert wake_requests(bursty, 30) == 60.0
    # a burst still going on at the end of the history counts as far as it has come
    assert wake_requests([0] * 5 + [20] * 12 + [0] * 5 + [20], 30) == (60 + 20) / 2
    # a stream that never paused for a boot: every bucket with arrivals stands for a wake
    assert wake_requests([4.0] * 100, 30) == pytest.approx(12.0, rel=0.02)
    assert wake_requests([], 30) == 1.0 and wake_requests([0.0] * 10, 30) == 1.0


def test_each_wake_is_kept_for_the_sizing_of_the_next() -> None:
    # wakes of 60, 20 and 5 callers (a boot covers 3 buckets); the last one still going on
    counts = [0] * 5 + [20] * 12 + [0] * 5 + [10] * 2 + [0] * 5 + [5]
    assert wake_sizes(counts, 30) == (60.0, 20.0, 5.0)
    assert wake_requests(counts, 30) == pytest.approx(85 / 3)
    many = ([0] * 4 + [3]) * (WAKES_KEPT + 4)
    assert wake_sizes(many, 30) == (3.0,) * WAKES_KEPT
    assert wake_sizes([], 30) == () and wake_sizes([0.0] * 5, 30) == ()


def test_however_cheap_a_cold_start_the_last_worker_is_as_warm_as_the_window() -> None:
    rng = random.Random(5)
    gaps = [rng.expovariate(1 / 300) for _ in range(200)]
    # one caller per cold start (90 s, less than keeping through a 300 s gap) or 50: the same
    # keep-alive, the window's; the price only weighs what lies beyond the window
    alone = fit_idle_windows(gaps, 30, 60, 600)
    burst = fit_idle_windows(gaps, 30, 60, 600, wake=50.0)
    assert alone.wake_requests == 1.0 and burst.wake_requests == 50.0
    for w in (alone, burst):
        assert w.prewarm_s is None and w.keepalive_s >= 600
    # not representative yet: the plain window prices the cold start the same way
    few = fit_idle_windows(gaps[:5], 30, 60, 600, wake=50.0)
    assert not few.representative and few.wake_requests == 50.0


def test_the_service_time_is_the_recent_mean_of_at_least_min_samples_at_most_max() -> None:
    assert mean_service_s([], T0) is None
    # newest first: 30 jobs of 2 s in the last minute, then a long history of 10 s jobs
    recent = [(T0 - i, 2.0) for i in range(30)]
    old = [(T0 - SERVICE_WINDOW_S - 1 - i, 10.0) for i in range(500)]
    assert mean_service_s(recent + old, T0) == 2.0
    # fewer than MIN_SAMPLES in the window: the latest MIN_SAMPLES, reaching back
    few = recent[:5]
    assert mean_service_s(few + old, T0) == pytest.approx(
        (5 * 2.0 + (MIN_SAMPLES - 5) * 10.0) / MIN_SAMPLES
    )
    assert mean_service_s(few, T0) == 2.0, "all there is"
    # a deployment ending more than MAX_SAMPLES jobs a minute: the newest MAX_SAMPLES
    dense = [(T0 - i * 0.01, 1.0) for i in range(MAX_SAMPLES)] + [(T0 - 30, 50.0)] * 100
    assert mean_service_s(dense, T0) == 1.0


def test_the_next_gap_may_come_sooner_than_any_seen() -> None:
    """Five gaps of a scheduled job, 590-605 s: the next gap is the shortest of six one time in
    six, and the window (900 s) would catch it. Whatever a miss costs (one caller or 100), the
    worker is ready before the shortest gap seen, with the margin."""
    gaps = [600.0, 598.0, 602.0, 590.0, 605.0]
    for wake in (1.0, 100.0):
        w = fit_idle_windows(gaps, 30, 60, 900, wake=wake, busy_s=5.0)
        assert w.prewarms and w.prewarm_s <= 590 * 0.9
        assert w.keepalive_s >= 605


def test_the_pauses_between_batches_outlast_the_last_gaps() -> None:
    """A job that sends 100 calls every 20 minutes: the last MAX_GAPS gaps hold two of its
    pauses, too few for the idle windows; the pauses from before them are read back too, and
    the windows pre-warm a worker ahead of the next batch."""
    h = ArrivalHistory()
    period, t = 1200.0, T0
    for _ in range(6):
        for i in range(100):
            h.record(t + i * 0.02)
        t += period
    stats = h.stats(t - period + 60)
    pauses = [g for g in stats.gaps if g >= IDLE_GAP_S]
    assert len(pauses) == 5 and min(pauses) == pytest.approx(period - 99 * 0.02)
    assert stats.gaps[-MAX_GAPS:] == tuple(h._gaps)  # the last gaps as they were, at the end
    # the last gaps alone are not representative; with the pauses before them, a period
    assert not fit_idle_windows(stats.gaps[-MAX_GAPS:], 30, 60, 600, wake=100, busy_s=10).prewarms
    windows = fit_idle_windows(stats.gaps, 30, 60, 600, wake=100, busy_s=10)
    assert windows.prewarms and windows.prewarm_s < period - 99 * 0.02


def test_the_pauses_are_bounded_and_not_counted_twice() -> None:
    """At most MAX_IDLE_GAPS pauses are kept; those among the last gaps appear once."""
    last = (1.0, 50.0, 2.0, 60.0)
    pauses = (10.0, 20.0, 30.0, 50.0, 60.0)  # the last two are the ones in `last`
    assert merged_gaps(last, pauses) == (10.0, 20.0, 30.0, *last)
    assert merged_gaps(last, (50.0, 60.0)) == last
    h = ArrivalHistory()
    for i in range(3 * MAX_IDLE_GAPS):
        h.record(T0 + i * 15.0)  # every gap is a pause
    gaps = h.stats(T0 + 10_000).gaps
    assert gaps == (15.0,) * min(3 * MAX_IDLE_GAPS - 1, MAX_GAPS)


def test_a_pause_may_end_between_two_seen() -> None:
    """A bursty deployment's pauses: five of 64-240 s, five of 648 s or more, and a wake costs
    65 callers a boot. None seen ends between 240 and 648 s, but the next may: one in eleven
    falls in that span. The worker is kept through the scale-down window (600 s), not released
    just past the pauses seen (at 264 s: what the fit gave when the gaps were points)."""
    pauses = [64.0, 116.0, 135.0, 156.0, 240.0, 648.0, 711.0, 868.0, 1171.0, 1833.0]
    burst = [0.5] * 200  # the calls of the bursts themselves: served by the worker up
    windows = fit_idle_windows(burst + pauses, 30, 60, 600, wake=65.5, busy_s=5.9)
    assert windows.representative and not windows.prewarms
    assert windows.keepalive_s == 600
    # a cold start of one caller too: no plan as warm as the window's keeps the worker less
    single = fit_idle_windows(burst + pauses, 30, 60, 600, wake=1.0, busy_s=5.9)
    assert not single.prewarms and single.keepalive_s == 600


def test_the_spread_gaps_count_what_a_dense_sample_of_them_counts() -> None:
    """`_Spread`, the distribution the idle windows are fitted on, against a sample of it:
    each gap shorter than a job as it is, each span between knots (a zero-width one included:
    two equal gaps) drawn as 20,000 evenly placed gaps of an equal share."""
    points = np.array([0.5, 1.0, 4.0])
    knots = np.array([27.0, 30.0, 30.0, 33.0, 50.0])
    spread = _Spread(points, knots)
    m = 20_000
    frac = (np.arange(m) + 0.5) / m
    inner = (knots[:-1, None] + np.diff(knots)[:, None] * frac[None, :]).ravel()
    share = knots.size / (knots.size - 1) / m
    sample = np.concatenate((points, inner))
    weight = np.concatenate((np.ones(points.size), np.full(inner.size, share)))
    assert spread.total == pytest.approx(weight.sum())
    xs = np.array([0.0, 0.7, 10.0, 27.0, 28.5, 30.0, 30.5, 33.0, 41.0, 50.0, 80.0])
    count, total = spread(xs)
    for x, c, t in zip(xs, count, total, strict=True):
        below = sample < x
        assert c == pytest.approx(weight[below].sum(), abs=1e-3)
        assert t == pytest.approx((weight * sample)[below].sum(), abs=1e-2)


def test_a_batch_is_a_wake_and_a_stream_is_a_rate() -> None:
    # The forecast is fitted for streams only: a batch of 200 calls every five minutes brings
    # twenty per boot on average, all in one bucket, and leaves most boot-long windows empty.
    batches = tuple(200.0 if i % 30 == 29 else 0.0 for i in range(120))
    stats = ArrivalStats(T0, T0, batches, (), T0 - 1.0)
    assert refit(stats, ScalingPolicy(), 30.0, 5.0).forecast is None
    # a Poisson stream of 1.5 calls per boot keeps its forecast at every boot time
    rng = random.Random(3)
    for boot_s in (5.0, 30.0, 84.0):
        dense = 0
        for _ in range(20):
            counts = tuple(poisson(rng, BUCKET_S / boot_s * 1.5) for _ in range(120))
            fitted = refit(ArrivalStats(T0, T0, counts, (), T0 - 1.0), ScalingPolicy(), boot_s, 5.0)
            dense += fitted.forecast is not None
        assert dense >= 17, (boot_s, dense)
    # the same calls spread out as a stream would be are a rate again
    spread = tuple(20.0 / 3 if i % 3 == 0 else 0.0 for i in range(120))
    stats = ArrivalStats(T0, T0, spread, (), T0 - 1.0)
    assert refit(stats, ScalingPolicy(), 30.0, 5.0).forecast is not None

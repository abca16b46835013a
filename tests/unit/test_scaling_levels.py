"""The holds of the workers above the last (`scaling/levels.py`), on a fake clock."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from control_plane.domain.scaling.levels import (
    EPISODES_KEPT,
    GAPS_KEPT,
    NO_FIT,
    NO_LEVELS,
    NOT_AGAIN,
    PRIOR_CALLERS,
    Levels,
    best_hold_s,
    hold_levels_s,
    kept_through_pause,
    level_fit,
    update_levels,
)
from control_plane.domain.scaling.policy import cold_cost_s, hold_s
from tests.unit.scaling_level_steps import (
    BOOT_S,
    ONE,
    SERVICE_S,
    SHORT_BURST_CALLERS,
    TICK_S,
    burst,
    held_after,
    step,
    tick,
)
from tests.unit.scaling_states import POLICY, T0


def test_before_its_first_episode_is_measured_a_level_costs_one_caller() -> None:
    assert NO_FIT.cold_callers == PRIOR_CALLERS == 1.0
    levels, _ = step(NO_LEVELS, 3, T0, 12.0)
    episode = levels.episodes[2]
    assert episode is not None and episode.began_at == T0 and levels.fits[2].callers == ()
    assert held_after(levels, T0, T0 + BOOT_S - 1) == 3


def test_a_level_is_priced_by_the_queueing_it_spares_over_a_boot() -> None:
    levels, end = burst(NO_LEVELS, T0, 10.0)
    assert levels.fits[2].callers == pytest.approx((SHORT_BURST_CALLERS,))
    assert levels.episodes[2] is None
    hold = hold_s(POLICY, BOOT_S, SHORT_BURST_CALLERS)  # 30 + 68 / 30 × 60 s: 166 s
    assert hold == pytest.approx(166.0)
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] == pytest.approx(hold)
    assert held_after(levels, T0 + BOOT_S, end + hold - 1) == 3
    assert held_after(levels, T0 + BOOT_S, end + hold + 1) == 2


def test_a_level_that_carries_a_backlog_through_its_boot_costs_more_than_the_window() -> None:
    # its 4 jobs wait the whole boot, and the queue grows by 0.4 a tick behind them:
    # 2 × (4 + 4.4 + ... ) = 2 × (15 × 4 + 0.8 × 105) = 288 caller-seconds, 9.6 callers
    levels, _ = burst(NO_LEVELS, T0, 40.0)
    assert levels.fits[2].callers == pytest.approx((9.6,))
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] == POLICY.scaledown_window_s


def test_a_level_a_stream_touches_for_a_moment_costs_a_fraction_of_a_caller() -> None:
    # one job beyond the two workers for one 2 s tick: 2 caller-seconds, a fifteenth of a boot
    levels, _ = step(NO_LEVELS, 3, T0, 9.0)
    levels = tick(levels, T0, T0 + 2.0, 3, 9.0)
    levels = tick(levels, T0 + 2.0, T0 + BOOT_S, 2, 6.0)
    assert levels.fits[2].callers == pytest.approx((2.0 / BOOT_S,))
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] == pytest.approx(BOOT_S + 4.0)


def backlog_need(ready: int, queued_s: float) -> float:
    """The callers of the third worker's episode when it is needed with 12 jobs queued (none
    running, `ready` workers there) that have built for `queued_s`; then its work as
    `burst`'s: 12 jobs in a slot for 10 s, 6 until a boot after the need."""
    levels, _ = update_levels(
        NO_LEVELS, 3, T0, BOOT_S, POLICY, demand=12.0, running=0.0, service_s=SERVICE_S,
        ready=ready, queued_s=queued_s,
    )  # fmt: skip
    levels = tick(levels, T0, T0 + 10.0, 3, 12.0)
    levels = tick(levels, T0 + 10.0, T0 + BOOT_S, 2, 6.0)
    (callers,) = levels.fits[2].callers
    return callers


def test_a_level_is_not_priced_by_a_queue_its_workers_below_would_have_served() -> None:
    # The queue of 12 built for 20 s with no worker ready. Held, the third worker and the two
    # below it would have been ready all along: the two below alone end 8 jobs every 10 s, 12
    # over those 20 s (less half a job a slot: the lag of a slot's first job), the whole queue,
    # so neither queue compared holds the 12 at the need, and the arrivals since (1.2 a second
    # while 12 jobs run) never fill the two workers' 8 slots before the work falls to 6: the
    # third spares nothing.
    assert backlog_need(ready=0, queued_s=20.0) == 0.0 < backlog_need(ready=0, queued_s=0.0)
    # the two below were ready and the queue built anyway: the queue is what the level spares
    assert backlog_need(ready=2, queued_s=20.0) == pytest.approx(backlog_need(0, 0.0))
    # one of the two below was missing for 10 s: its 4 slots would have ended 2 jobs
    assert backlog_need(ready=1, queued_s=10.0) < backlog_need(ready=1, queued_s=0.0)
    # ... for 5 s, half a service time: each slot would still be at its first job
    assert backlog_need(ready=1, queued_s=5.0) == backlog_need(ready=1, queued_s=0.0)


def test_a_level_needed_again_at_each_swing_is_held_through_the_swings() -> None:
    # priced at 68 caller-seconds a swing at first (a 166 s ski-rental time; the later swings
    # also count the tick before their need: 94.4), needed again 200 s after each: spanning
    # the gaps costs less than releasing at once and booting again at each swing
    levels = NO_LEVELS
    at = T0
    for _ in range(4):
        levels, _ = burst(levels, at, 10.0)
        levels = tick(levels, at + BOOT_S, at + 210.0 - TICK_S, 2, 6.0)
        at += 210.0
    fit = levels.fits[2]
    assert fit.gaps == (200.0,) * 3
    assert fit.callers == pytest.approx((SHORT_BURST_CALLERS,) + (94.4 / BOOT_S,) * 3)
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] > 200.0
    assert held_after(levels, at - 210.0 + BOOT_S, at - 2.0) == 3


def test_gaps_too_long_to_span_are_not_held_for() -> None:
    cold = cold_cost_s(POLICY, BOOT_S)
    gap = ONE + cold + 10  # spanning costs more than releasing and booting again
    # every gap outlasts the ski-rental time, but not the window: the level keeps that time
    # (a need within the window has been seen, so the next may come sooner), nothing longer
    assert best_hold_s([gap] * 3, ONE, cold, 600) == ONE
    # one gap within it and the hold spares a cold start: kept for the ski-rental time
    assert best_hold_s([gap, 60.0, 60.0], ONE, cold, 600) == ONE
    # gaps beyond the window only: released at once
    assert best_hold_s([NOT_AGAIN] * 3, ONE, cold, 600) == 0.0


def test_a_level_needed_again_within_the_window_is_never_released_at_once() -> None:
    # A level of 200-call bursts priced at 0.41 callers, a caller's wait through a boot priced
    # at the window (a cold start of 276 s), needed again 248 s after one need and not within
    # the window after two: releasing it at once costs least over those gaps (4 × 276 against
    # 248 + 2 × 552), but one need in three came within the window, and the next may too. It
    # keeps its ski-rental time.
    policy = dataclasses.replace(POLICY, cold_penalty_s=600.0)
    cold = cold_cost_s(policy, BOOT_S, 0.41)
    floor = hold_s(policy, BOOT_S, 0.41)
    assert floor == cold == pytest.approx(276.0)
    assert 4 * cold < 248.0 + 2 * (floor + cold)
    assert best_hold_s([248.0, NOT_AGAIN, NOT_AGAIN], floor, cold, 600) == floor
    # once every gap it has outlasted the window, no hold
    assert best_hold_s([NOT_AGAIN] * 3, floor, cold, 600) == 0.0


def test_a_level_not_needed_again_within_the_window_counts_a_gap_no_hold_spans() -> None:
    levels, _ = step(NO_LEVELS, 3, T0, 12.0)
    later = T0 + POLICY.scaledown_window_s
    levels, held = step(levels, 0, later, 0.0)
    assert held == 0
    assert levels.needed_at[2] is None and levels.fits[2].gaps == (NOT_AGAIN,)
    # the last worker's level is the idle windows' (no gaps are kept for it)
    assert levels.fits[0] == NO_FIT


def test_a_level_whose_past_says_it_is_not_needed_again_is_released_at_once() -> None:
    # priced above the window (ten callers: 630 s), it is held for the window at first; once
    # its past pays for the risk that the next need comes sooner than any seen, not at all
    cold = cold_cost_s(POLICY, BOOT_S, 10.0)
    assert cold > POLICY.scaledown_window_s
    assert best_hold_s([NOT_AGAIN], 600, cold, 600) == 600  # 2 × 630 > 600 + 630
    assert best_hold_s([NOT_AGAIN] * 2, 600, cold, 600) == 0.0  # 3 × 630 < 2 × (600 + 630)
    # ... but not while it keeps being needed again within the window
    assert best_hold_s([300.0, 300.0, NOT_AGAIN], 600, cold, 600) == 600
    fit = level_fit((NOT_AGAIN,) * 2, 0.0, (10.0,))
    assert hold_levels_s(Levels((None,) * 3, (NO_FIT, NO_FIT, fit)), BOOT_S, POLICY) == [
        ONE, 0.0
    ]  # fmt: skip


def test_gaps_shorter_than_a_boot_are_not_kept_and_the_past_is_bounded() -> None:
    levels = NO_LEVELS
    for i in range(5):  # needed again every 29 s: one episode
        levels, _ = step(levels, 3, T0 + 29 * i, 12.0)
    assert levels.fits[2].gaps == ()
    for i in range(GAPS_KEPT + 5):
        levels, _ = step(levels, 3, T0 + 1000 + 100 * i, 12.0)
    assert len(levels.fits[2].gaps) == GAPS_KEPT
    assert len(levels.fits[2].callers) == EPISODES_KEPT < GAPS_KEPT


def test_a_kind_of_gap_not_among_the_last_few_is_still_spanned() -> None:
    # a level needed (a 10 s burst of 3 workers' work) every 60 s, three times only after 250 s,
    # then ten times every 60 s again: the 242 s gaps are not among its last eight, and its hold
    # still spans them (the ski-rental time at its price, 2.27 callers, is 166 s)
    levels, t = NO_LEVELS, T0
    for gap in [60.0] * 3 + [250.0] * 3 + [60.0] * 10:
        levels = tick(levels, t, t + 10, 3, 12.0)
        levels = tick(levels, t + 10, t + gap, 2, 6.0)
        t += gap
    assert levels.fits[2].gaps[-8:] == (52.0,) * 8  # from its last need to the next
    assert hold_s(POLICY, BOOT_S, SHORT_BURST_CALLERS) == pytest.approx(166, abs=1)
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] >= 242


def test_best_hold_weighs_idle_seconds_against_cold_starts() -> None:
    cold = cold_cost_s(POLICY, BOOT_S)
    assert best_hold_s([], ONE, cold, 600) == ONE  # no past: the ski-rental time
    # two gaps of 150 s and one the window never saw end: spanning 150 s costs 150 + 150 +
    # (150 + 90) = 540 against (90 + 90) × 3 = 540 for the ski-rental time (ties: the shorter
    # hold); no hold at all, 4 × 90 = 360, is not tried: the level was needed again within the
    # window
    assert best_hold_s([150.0, 150.0, NOT_AGAIN], ONE, cold, 600) == ONE
    # a cold start of ten callers: spanning the gaps is cheapest
    ten = cold_cost_s(POLICY, BOOT_S, 10.0)
    assert best_hold_s([150.0, 150.0, NOT_AGAIN], 600, ten, 600) == 600
    assert best_hold_s([150.0, 150.0, 149.0], 300, ten, 600) == 300
    # never beyond the scale-down window: gaps beyond it are spared by no hold
    assert best_hold_s([700.0] * 4, 600, ten, 600) == 0.0
    assert math.isinf(NOT_AGAIN)


def test_best_hold_is_the_cheapest_hold_over_the_gaps_by_their_plain_cost() -> None:
    # The definition, a pass over the gaps per hold tried, against the sorted sweep: the same
    # hold (whole-second gaps and prices, so every sum is exact and ties are real ties), or on
    # fractional ones a hold of the same cost up to rounding.
    def cost(hold: float, gaps: list[float], cold: float) -> float:
        if hold == 0.0:
            return cold + sum(cold for _ in gaps)
        return sum(g if g <= hold else hold + cold for g in gaps)

    rng = random.Random(5)
    for case in range(3000):
        whole = case % 2 == 0
        n = rng.randint(0, 40)

        # NOT_AGAIN now and then; whole seconds on a coarse grid, where holds of equal cost
        # come up, or any fraction
        gaps = [
            NOT_AGAIN
            if rng.random() < 0.15
            else float(rng.randrange(40, 700, 20))
            if whole
            else rng.uniform(31, 900)
            for _ in range(n)
        ]
        if n and rng.random() < 0.3:  # repeated gaps (a stream's period)
            gaps += [gaps[0]] * rng.randint(1, 5)
        cold = float(rng.randrange(40, 1500, 20)) if whole else rng.uniform(31, 1500)
        floor = min(cold, 600.0)
        tried = {floor, *(g for g in gaps if floor < g <= 600.0)}
        costs = {h: cost(h, gaps, cold) for h in tried}
        if gaps and min(gaps) > 600.0:  # no hold at all: only past gaps beyond the window
            costs[0.0] = cost(0.0, gaps, cold)
        expected = min(costs, key=lambda h: (costs[h], h == 0.0, h))
        got = best_hold_s(gaps, floor, cold, 600.0)
        if whole:
            assert got == expected, (gaps, cold)
        else:
            assert got in costs and costs[got] == pytest.approx(costs[expected], rel=1e-12)


def test_the_holds_as_the_api_shows_them() -> None:
    assert hold_levels_s(NO_LEVELS, BOOT_S, POLICY) == []
    levels = NO_LEVELS
    for i in range(4 * 60 + 1):  # every 2 s: two workers' work, three's every 120 s for 40 s
        busy = i % 60 < 20
        levels, _ = step(levels, 3 if busy else 2, T0 + 2 * i, 12.0 if busy else 8.0)
    # the second worker was needed throughout (one episode, at the first burst); the third
    # again after gaps of 82 s; each carried a burst through a boot: held for the window.
    # (The first episode counts from its need; the later ones the tick before it too, when
    # the jobs that made it needed came: 2 × (4 + 4.8 + ... + 16) = 320 caller-seconds.)
    assert levels.fits[2].gaps == (82.0,) * 4
    assert levels.fits[2].callers == pytest.approx((9.6,) + (320.0 / BOOT_S,) * 3)
    assert hold_levels_s(levels, BOOT_S, POLICY) == [POLICY.scaledown_window_s] * 2


def test_a_hold_fitted_before_follows_the_prices_and_window_of_now() -> None:
    fit = level_fit((120.0,) * 4, 120.0, (0.0,))
    levels = Levels((None,) * 3, (NO_FIT, NO_FIT, fit))
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] == 120.0
    # boots measured longer since: the ski-rental time (200 s, no caller) is above the hold
    assert hold_levels_s(levels, 200.0, POLICY)[1] == 200.0
    # a scale-down window shortened since caps it
    shorter = dataclasses.replace(POLICY, scaledown_window_s=100.0)
    assert hold_levels_s(levels, BOOT_S, shorter)[1] == 100.0


def test_a_hold_lies_between_the_ski_rental_time_at_its_price_and_the_window() -> None:
    # `_hold_s` spells out policy.hold_s in conditionals (every tick reads it for each level
    # above the work): the same hold as the rule, for any fit, boot and policy
    rng = random.Random(11)
    for _ in range(2000):
        callers = tuple(rng.choice([0.0, rng.uniform(0, 30)]) for _ in range(rng.randint(0, 8)))
        gaps = tuple(rng.choice([NOT_AGAIN, rng.uniform(5, 900)]) for _ in range(rng.randint(0, 5)))
        fitted = rng.choice([0.0, rng.uniform(0, 900)])
        policy = dataclasses.replace(
            POLICY,
            scaledown_window_s=rng.choice([0.0, rng.uniform(1, 1200)]),
            cold_penalty_s=rng.choice([0.0, rng.uniform(0, 1200)]),
        )
        boot_s = rng.uniform(1, 120)
        fit = level_fit(gaps, fitted, callers)
        levels = Levels((None,) * 2, (NO_FIT, fit))
        rule = min(max(fitted, hold_s(policy, boot_s, fit.cold_callers)), policy.scaledown_window_s)
        expected = 0.0 if fitted == 0.0 and gaps else rule
        assert hold_levels_s(levels, boot_s, policy) == [expected]


def test_a_levels_fit_keeps_its_gaps_in_order_its_mean_price_and_its_best_hold() -> None:
    # each refit puts the new gap in its place among the sorted ones (the oldest leaving once
    # GAPS_KEPT are kept) and reuses them where only a price came: the fits a random stream of
    # needs leaves, at every tick, are those built afresh from their gaps and callers
    rng = random.Random(12)
    levels, now = NO_LEVELS, T0
    trimmed = False
    for _ in range(3000):
        now += rng.choice([2.0, 2.0, 2.0, rng.uniform(2, 900)])
        needed = rng.choice([0, 1, 2, rng.randint(3, 8)])
        levels, _ = step(levels, needed, now, rng.uniform(0, 80))
        for fit in levels.fits:
            assert fit.ordered == tuple(sorted(fit.gaps))
            trimmed = trimmed or len(fit.gaps) == GAPS_KEPT
    assert trimmed  # the oldest gap left some level's sample
    refit = 0
    for fit in levels.fits[1:]:
        assert fit.ordered == tuple(sorted(fit.gaps))
        price = sum(fit.callers) / len(fit.callers) if fit.callers else PRIOR_CALLERS
        assert fit.cold_callers == price
        if fit.gaps or fit.callers:
            refit += 1
            floor = hold_s(POLICY, BOOT_S, price)
            cold = cold_cost_s(POLICY, BOOT_S, price)
            expected = best_hold_s(fit.gaps, floor, cold, POLICY.scaledown_window_s)
            assert fit.hold_s == expected
    assert refit >= 5


def test_a_pause_keeps_the_held_workers_whose_miss_costs_more_than_it_spares() -> None:
    """On a pre-warm plan the holds pause from the end of the work to the pre-warm: a level is
    kept through the pause only if its cold start, at the chance of a call before the pre-warm
    is ready, costs more than the idle seconds the pause spares; with the workers below it."""
    levels, end = burst(NO_LEVELS, T0, 40.0)
    now = end + TICK_S
    levels, held = step(levels, 0, now, 0.0)
    assert held == 3
    # the second worker spared 9.6 callers, the third half a caller: 606 and 60 worker-seconds
    fits = (levels.fits[0], level_fit(callers=(9.6,)), level_fit(callers=(0.5,)))
    levels = levels._replace(fits=fits)
    assert cold_cost_s(POLICY, BOOT_S, 9.6) == pytest.approx(606.0)
    assert cold_cost_s(POLICY, BOOT_S, 0.5) == pytest.approx(60.0)
    assert kept_through_pause(levels, now, BOOT_S, POLICY, 50.0, 1.0) == 3
    assert kept_through_pause(levels, now, BOOT_S, POLICY, 100.0, 1.0) == 2
    assert kept_through_pause(levels, now, BOOT_S, POLICY, 100.0, 0.1) == 0
    # a level whose hold has run out is not kept, whatever it costs
    later = now + POLICY.scaledown_window_s
    assert kept_through_pause(levels, later, BOOT_S, POLICY, 0.0, 1.0) == 0

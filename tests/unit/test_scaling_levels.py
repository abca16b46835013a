"""The holds of the workers above the last (`scaling/levels.py`), on a fake clock."""

from __future__ import annotations

import dataclasses
import math

from control_plane.domain.scaling import ScalingPolicy
from control_plane.domain.scaling.levels import (
    GAPS_KEPT,
    NO_FIT,
    NO_LEVELS,
    NOT_AGAIN,
    PRIOR_CALLERS,
    LevelFit,
    Levels,
    best_hold_s,
    hold_levels_s,
    update_levels,
)
from control_plane.domain.scaling.policy import cold_cost_s, hold_s

T0 = 1_000_000.0
POLICY = ScalingPolicy(
    min_workers=0, max_workers=8, target_concurrency=4, scaledown_window_s=600, queue_wait_s=0
)
BOOT_S = 30.0
TICK_S = 2.0
ONE = hold_s(POLICY, BOOT_S)  # 30 s boot + 60 s for one caller: 90 s


def tick(levels: Levels, since: float, until: float, needed: int, demand: float) -> Levels:
    """Ticks every 2 s after `since` up to `until` with the same need and demand."""
    t = since
    while t < until:
        t = min(t + TICK_S, until)
        levels, _ = update_levels(levels, needed, t, BOOT_S, POLICY, demand)
    return levels


def held_after(levels: Levels, since: float, now: float) -> int:
    """Workers held at `now` when two are needed (and two workers' work is present)."""
    held = 0
    t = since
    while t < now:
        t = min(t + TICK_S, now)
        levels, held = update_levels(levels, 2, t, BOOT_S, POLICY, 8.0)
    return held


def burst(levels: Levels, at: float, lasts_s: float) -> tuple[Levels, float]:
    """Three workers' work (12 jobs) from `at` for `lasts_s`; returns when it ended."""
    levels, _ = update_levels(levels, 3, at, BOOT_S, POLICY, 12.0)
    return tick(levels, at, at + lasts_s, 3, 12.0), at + lasts_s


def test_before_its_first_episode_is_measured_a_level_costs_one_caller() -> None:
    assert NO_FIT.cold_callers == PRIOR_CALLERS == 1.0
    levels, _ = update_levels(NO_LEVELS, 3, T0, BOOT_S, POLICY, 12.0)
    assert levels.began_at[2] == T0 and levels.fits[2].callers == ()
    assert held_after(levels, T0, T0 + BOOT_S - 1) == 3


def test_a_level_still_busy_a_boot_after_its_need_is_priced_by_the_callers_it_holds() -> None:
    # the third worker holds 4 jobs when a replacement started at its need would be ready:
    # each of them would have waited through a whole boot
    levels, end = burst(NO_LEVELS, T0, 40.0)
    assert levels.fits[2].callers == (4.0,) and levels.began_at[2] is None
    four = hold_s(POLICY, BOOT_S, 4.0)  # 30 + 4 × 60 s
    # (the second worker held 4 of the 12 jobs too)
    assert four == 270.0 and hold_levels_s(levels, BOOT_S, POLICY) == [four, four]
    assert held_after(levels, end, end + four - 1) == 3
    assert held_after(levels, end, end + four + 1) == 2


def test_a_level_whose_burst_ends_within_a_boot_costs_its_boot_only() -> None:
    # its callers waited for a slot of the two workers below, never for a boot
    levels, end = burst(NO_LEVELS, T0, 10.0)
    levels = tick(levels, end, T0 + BOOT_S, 2, 8.0)
    assert levels.fits[2].callers == (0.0,)
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] == BOOT_S
    assert held_after(levels, T0 + BOOT_S, end + BOOT_S - 1) == 3
    assert held_after(levels, T0 + BOOT_S, end + BOOT_S + 1) == 2


def test_a_level_needed_again_at_each_swing_is_held_through_the_swings() -> None:
    # four callers a swing (a 270 s ski-rental time), needed again 360 s after each: spanning
    # a gap costs 360 s, releasing and booting again 270 + 270 s
    levels = NO_LEVELS
    at = T0
    for _ in range(4):
        levels, end = burst(levels, at, 40.0)
        levels = tick(levels, end, at + 400.0, 2, 8.0)
        at += 400.0
    # each gap from the end of a burst to the next: 360 s, spanned (three of them: 1,080 s;
    # released at once, 4 × 270 s, the same: a tie goes to the hold)
    assert levels.fits[2].gaps == (360.0,) * 3 and levels.fits[2].hold_s == 360.0
    assert held_after(levels, at - 400.0 + 40.0, at - 2.0) == 3


def test_gaps_too_long_to_span_are_not_held_for() -> None:
    cold = cold_cost_s(POLICY, BOOT_S)
    gap = ONE + cold + 10  # spanning costs more than releasing and booting again
    # holding for the ski-rental time spares nothing: every gap outlasts it
    assert best_hold_s([gap] * 3, ONE, cold, 600) == 0.0
    # one gap within it and the hold spares a cold start: kept for the ski-rental time
    assert best_hold_s([gap, 60.0, 60.0], ONE, cold, 600) == ONE


def test_a_level_not_needed_again_within_the_window_counts_a_gap_no_hold_spans() -> None:
    levels, _ = update_levels(NO_LEVELS, 3, T0, BOOT_S, POLICY, 12.0)
    later = T0 + POLICY.scaledown_window_s
    levels, held = update_levels(levels, 0, later, BOOT_S, POLICY)
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
    fit = LevelFit((NOT_AGAIN,) * 2, 0.0, (10.0,))
    assert hold_levels_s(Levels((None,) * 3, (NO_FIT, NO_FIT, fit)), BOOT_S, POLICY) == [
        ONE, 0.0
    ]  # fmt: skip


def test_gaps_shorter_than_a_boot_are_not_kept_and_the_past_is_bounded() -> None:
    levels = NO_LEVELS
    for i in range(5):  # needed again every 29 s: one episode
        levels, _ = update_levels(levels, 3, T0 + 29 * i, BOOT_S, POLICY, 12.0)
    assert levels.fits[2].gaps == ()
    for i in range(GAPS_KEPT + 5):
        levels, _ = update_levels(levels, 3, T0 + 1000 + 100 * i, BOOT_S, POLICY, 12.0)
    assert len(levels.fits[2].gaps) == GAPS_KEPT
    assert len(levels.fits[2].callers) == GAPS_KEPT


def test_best_hold_weighs_idle_seconds_against_cold_starts() -> None:
    cold = cold_cost_s(POLICY, BOOT_S)
    assert best_hold_s([], ONE, cold, 600) == ONE  # no past: the ski-rental time
    # two gaps of 150 s and one the window never saw end: spanning 150 s costs 150 + 150 +
    # (150 + 90) = 540 against (90 + 90) × 3 = 540 for the ski-rental time, and no hold at all
    # 4 × 90 = 360: the past says the level is needed again after more than its price
    assert best_hold_s([150.0, 150.0, NOT_AGAIN], ONE, cold, 600) == 0.0
    # a cold start of ten callers: spanning the gaps is cheapest
    ten = cold_cost_s(POLICY, BOOT_S, 10.0)
    assert best_hold_s([150.0, 150.0, NOT_AGAIN], 600, ten, 600) == 600
    assert best_hold_s([150.0, 150.0, 149.0], 300, ten, 600) == 300
    # never beyond the scale-down window: gaps beyond it are spared by no hold
    assert best_hold_s([700.0] * 4, 600, ten, 600) == 0.0
    assert math.isinf(NOT_AGAIN)


def test_the_holds_as_the_api_shows_them() -> None:
    assert hold_levels_s(NO_LEVELS, BOOT_S, POLICY) == []
    levels = NO_LEVELS
    for i in range(4 * 60 + 1):  # every 2 s: two workers' work, three's every 120 s for 40 s
        busy = i % 60 < 20
        levels, _ = update_levels(
            levels, 3 if busy else 2, T0 + 2 * i, BOOT_S, POLICY, 12.0 if busy else 8.0
        )
    # the second worker was needed throughout (one episode, its callers at its first boot);
    # the third again after gaps of 82 s, each time still busy a boot later
    assert levels.fits[2].gaps == (82.0,) * 4
    assert levels.fits[2].callers == (4.0,) * 4
    assert hold_levels_s(levels, BOOT_S, POLICY) == [hold_s(POLICY, BOOT_S, 4.0)] * 2


def test_a_hold_fitted_before_follows_the_prices_and_window_of_now() -> None:
    fit = LevelFit((120.0,) * 4, 120.0, (0.0,))
    levels = Levels((None,) * 3, (NO_FIT, NO_FIT, fit))
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] == 120.0
    # boots measured longer since: the ski-rental time (200 s, no caller) is above the hold
    assert hold_levels_s(levels, 200.0, POLICY)[1] == 200.0
    # a scale-down window shortened since caps it
    shorter = dataclasses.replace(POLICY, scaledown_window_s=100.0)
    assert hold_levels_s(levels, BOOT_S, shorter)[1] == 100.0

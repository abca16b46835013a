"""The holds of the workers above the last (`scaling/levels.py`), on a fake clock."""

from __future__ import annotations

import dataclasses
import math

from control_plane.domain.scaling import ScalingPolicy
from control_plane.domain.scaling.levels import (
    GAPS_KEPT,
    NO_LEVELS,
    NOT_AGAIN,
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
DEFAULT = hold_s(POLICY, BOOT_S)  # 30 s boot + 60 s for the caller it makes wait: 90 s
COLD = cold_cost_s(POLICY, BOOT_S)


def swings(levels: Levels, start: float, gap: float, times: int) -> tuple[Levels, float]:
    """A third worker needed at `start`, then again `gap` seconds after each last need."""
    now = start
    for _ in range(times):
        levels, _ = update_levels(levels, 3, now, BOOT_S, POLICY)
        now += gap
    return levels, now - gap


def held_after(levels: Levels, since: float, now: float) -> int:
    """Workers held at `now` when two are needed (the ticks between included, every 2 s)."""
    held = 0
    t = since
    while t < now:
        t = min(t + 2.0, now)
        levels, held = update_levels(levels, 2, t, BOOT_S, POLICY)
    return held


def test_without_a_past_a_level_is_held_for_the_ski_rental_time() -> None:
    levels, _ = update_levels(NO_LEVELS, 3, T0, BOOT_S, POLICY)
    assert held_after(levels, T0, T0 + DEFAULT - 1) == 3
    assert held_after(levels, T0, T0 + DEFAULT + 1) == 2


def test_a_level_needed_again_at_each_swing_is_held_through_the_swings() -> None:
    gap = 120.0  # longer than the ski-rental time, and cheaper to span than a cold start
    assert gap < DEFAULT + COLD
    levels, last = swings(NO_LEVELS, T0, gap, 4)
    assert levels.fits[2].gaps == (gap,) * 3
    assert levels.fits[2].hold_s == gap
    assert held_after(levels, last, last + gap - 1) == 3
    assert held_after(levels, last, last + gap + 1) == 2


def test_gaps_too_long_to_span_leave_the_ski_rental_time() -> None:
    gap = DEFAULT + COLD + 10  # spanning costs more than releasing and booting again
    levels, last = swings(NO_LEVELS, T0, gap, 4)
    assert levels.fits[2].hold_s == DEFAULT
    assert held_after(levels, last, last + DEFAULT + 1) == 2


def test_the_hold_is_never_shorter_than_the_ski_rental_time() -> None:
    # needed again 40 s after each need (just over a boot), or never again: the cheapest hold
    # over such a past would be 40 s, but a level needed again under load makes wait more
    # callers than the one its price counts
    assert best_hold_s([40.0, NOT_AGAIN, NOT_AGAIN], DEFAULT, COLD, 600) == DEFAULT
    levels, last = swings(NO_LEVELS, T0, 40.0, 3)
    assert held_after(levels, last, last + DEFAULT - 1) == 3


def test_a_level_not_needed_again_within_the_window_counts_a_gap_no_hold_spans() -> None:
    levels, _ = update_levels(NO_LEVELS, 3, T0, BOOT_S, POLICY)
    later = T0 + POLICY.scaledown_window_s
    levels, held = update_levels(levels, 0, later, BOOT_S, POLICY)
    assert held == 0
    assert levels.needed_at[2] is None and levels.fits[2].gaps == (NOT_AGAIN,)
    # the last worker's level is the idle windows' (no gaps are kept for it)
    assert levels.fits[0].gaps == (NOT_AGAIN,)


def test_gaps_shorter_than_a_boot_are_not_kept_and_the_past_is_bounded() -> None:
    levels, _ = swings(NO_LEVELS, T0, BOOT_S - 1, 5)
    assert levels.fits[2].gaps == ()
    levels, _ = swings(NO_LEVELS, T0, 100.0, GAPS_KEPT + 5)
    assert len(levels.fits[2].gaps) == GAPS_KEPT


def test_best_hold_weighs_idle_seconds_against_cold_starts() -> None:
    assert best_hold_s([], DEFAULT, COLD, 600) == DEFAULT
    # two gaps of 150 s and one the window never saw end: spanning 150 s costs 150 + 150 +
    # (150 + 90) = 540 against (90 + 90) × 3 = 540 for the default: a tie goes to the shorter
    assert best_hold_s([150.0, 150.0, NOT_AGAIN], DEFAULT, COLD, 600) == DEFAULT
    assert best_hold_s([150.0, 150.0, 149.0, NOT_AGAIN], DEFAULT, COLD, 600) == 150.0
    # never beyond the scale-down window
    assert best_hold_s([700.0] * 4, DEFAULT, COLD, 600) == DEFAULT
    assert math.isinf(NOT_AGAIN)


def test_the_holds_as_the_api_shows_them() -> None:
    assert hold_levels_s(NO_LEVELS, BOOT_S, POLICY) == []
    levels = NO_LEVELS
    for tick in range(4 * 60 + 1):  # every 2 s: two workers needed, three every 120 s
        levels, _ = update_levels(levels, 3 if tick % 60 == 0 else 2, T0 + 2 * tick, 30.0, POLICY)
    # the second worker was needed throughout; the third again after gaps of 120 s
    assert levels.fits[2].gaps == (120.0,) * 4
    assert hold_levels_s(levels, BOOT_S, POLICY) == [DEFAULT, 120.0]


def test_a_hold_fitted_before_follows_the_prices_and_window_of_now() -> None:
    levels = NO_LEVELS
    for tick in range(4 * 60 + 1):  # the third worker needed again every 120 s
        levels, _ = update_levels(levels, 3 if tick % 60 == 0 else 2, T0 + 2 * tick, 30.0, POLICY)
    assert hold_levels_s(levels, BOOT_S, POLICY)[1] == 120.0
    # boots measured longer since: the ski-rental time (100 + 60 s) is above the fitted hold
    assert hold_levels_s(levels, 100.0, POLICY)[1] == 160.0
    # a scale-down window shortened since caps it
    shorter = dataclasses.replace(POLICY, scaledown_window_s=100.0)
    assert hold_levels_s(levels, BOOT_S, shorter)[1] == 100.0

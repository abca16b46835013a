"""How long each worker above the last is kept once no part of the decision asks for it.

A worker released and needed again costs a cold start: its boot, and the callers that queue
while it boots. Kept, it costs one worker-second per second. Without knowing when it will be
needed again, keeping it for as long as a cold start of one caller costs (`policy.hold_s`) is
the ski-rental rule: never more than twice the best choice made in hindsight.

Each level (the k-th worker, k ≥ 2; the last one is the idle windows') also remembers its own
past: the gaps between the times it was needed, those longer than a boot (a shorter one is
held through whatever the hold, since a new boot alone costs more than it). A level released at
the end of each swing of a stream and needed again at the next, a minute or two later, sees
such gaps again and again; the first backlog's levels see that they were not needed again
within the scale-down window. A level is held for the longer of the ski-rental time and the
hold that would have cost least over its gaps (the ATC'20 histogram policy's idea, per level):
long enough to span the gaps it keeps seeing, when spanning them costs less than booting
again.

The learned hold only lengthens the ski-rental time, never shortens it. Under load, a level
needed again makes wait every caller that queues while it boots, not one: the one-caller price
is a floor. Allowed to shorten on that price (simulator, Mooncake trace, T_cold 30 s), the
holds fell to the shortest gaps seen, boots went from 19 to 26 and the p99 from keep-alive's
+ 0.98 s to + 2.37 s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from control_plane.domain.scaling.policy import ScalingPolicy, cold_cost_s, hold_s

# Gaps kept per level: the recent ones, so that a level follows a change of the stream's rhythm
# within a few swings, and no one gap decides alone once a few are in (each weighs an eighth).
GAPS_KEPT = 8
# The gap of a level not needed again within the scale-down window: no hold spans it.
NOT_AGAIN = math.inf


@dataclass(frozen=True, slots=True)
class LevelFit:
    """One level's recent gaps between needs (oldest first) and the hold they ask for."""

    gaps: tuple[float, ...] = ()
    hold_s: float = 0.0  # the hold (≥ the ski-rental time) that would have cost least (0: none)


NO_FIT = LevelFit()


@dataclass(frozen=True, slots=True)
class Levels:
    """What the levels carry from one tick to the next (`decide.Memory.levels`)."""

    needed_at: tuple[float | None, ...] = ()  # [k - 1]: when k workers were last needed
    fits: tuple[LevelFit, ...] = ()  # [k - 1]: level k's gaps (only changed when one ends)


NO_LEVELS = Levels()


def update_levels(
    levels: Levels, needed: int, now: float, boot_s: float, policy: ScalingPolicy
) -> tuple[Levels, int]:
    """The levels after a tick where `needed` workers are asked for, and how many workers to
    keep: the `needed`, or more up to the highest level from 2 up whose hold has not run out."""
    cap = policy.scaledown_window_s
    default = hold_s(policy, boot_s)
    n = max(len(levels.needed_at), needed)
    needed_at = list(levels.needed_at) + [None] * (n - len(levels.needed_at))
    fits = list(levels.fits) + [NO_FIT] * (n - len(levels.fits))
    refit = False
    held = needed
    for k in range(n):
        last = needed_at[k]
        if k < needed:
            if k > 0 and last is not None and now - last > boot_s:
                fits[k] = _with_gap(fits[k], now - last, default, policy, boot_s)
                refit = True
            needed_at[k] = now
            continue
        if last is None:
            continue
        if now - last >= cap:  # not needed again within the longest hold there is
            fits[k] = _with_gap(fits[k], NOT_AGAIN, default, policy, boot_s)
            needed_at[k] = None
            refit = True
        elif k > 0 and now - last < _hold_s(fits[k], default, cap):
            held = k + 1
    kept = tuple(fits) if refit or n > len(levels.fits) else levels.fits
    return Levels(tuple(needed_at), kept), held


def hold_levels_s(levels: Levels, boot_s: float, policy: ScalingPolicy) -> list[float]:
    """How long each level from 2 up that has been needed is held once no longer needed:
    [0] the second worker's hold, [1] the third's, ..."""
    default = hold_s(policy, boot_s)
    return [_hold_s(fit, default, policy.scaledown_window_s) for fit in levels.fits[1:]]


def _hold_s(fit: LevelFit, default: float, cap: float) -> float:
    # Fitted against the prices and window of its time: the boot measured since, or a policy
    # changed since, may have moved the ski-rental time or the window past it.
    return min(max(fit.hold_s, default), cap)


def best_hold_s(gaps: Sequence[float], floor_s: float, cold_s: float, cap: float) -> float:
    """The hold of at least `floor_s` that would have cost least over `gaps`: a gap within
    the hold costs its length in idle worker-seconds, a longer one the hold and then a cold
    start (`cold_s`). Tried: the floor and each gap between it and `cap` (the cost bends only
    there); ties go to the shorter hold."""
    best, best_cost = floor_s, math.inf
    for hold in sorted({floor_s, *(g for g in gaps if floor_s < g <= cap)}):
        cost = sum(g if g <= hold else hold + cold_s for g in gaps)
        if cost < best_cost:
            best, best_cost = hold, cost
    return best


def _with_gap(
    fit: LevelFit, gap: float, default: float, policy: ScalingPolicy, boot_s: float
) -> LevelFit:
    gaps = (*fit.gaps, gap)[-GAPS_KEPT:]
    cold_s = cold_cost_s(policy, boot_s)
    return LevelFit(gaps, best_hold_s(gaps, default, cold_s, policy.scaledown_window_s))

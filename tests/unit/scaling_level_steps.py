"""The ticks the levels' tests step through (`scaling/levels.py`), on a fake clock (plain
floats): a need of so many workers with so many jobs present, tick by tick, and a short burst."""

from __future__ import annotations

import random

from control_plane.domain.scaling.levels import Levels, update_levels
from control_plane.domain.scaling.policy import hold_s
from tests.unit.scaling_states import POLICY

BOOT_S = 30.0
TICK_S = 2.0
SERVICE_S = 10.0  # what a job holds its slot
ONE = hold_s(POLICY, BOOT_S)  # 30 s boot + 60 s for one caller: 90 s
# Three workers' work (12 jobs) from a level's need for 10 s, then 6 (less than two workers'
# slots): without the third worker, its 4 jobs queue, and the arrivals the third would have
# served pile up behind them (0.4 a tick) until the calm drains them; with it, none wait.
# Caller-seconds spared, tick by tick: 2 × (4 + 4.8 + 5.6 + 6.4 + 7.2) over the burst, then
# 2 × (2 + 1.6 + 1.2 + 0.8 + 0.4) while the queue drains: 68.
SHORT_BURST_CALLERS = 68.0 / BOOT_S


def step(levels: Levels, needed: int, t: float, demand: float) -> tuple[Levels, int]:
    """One tick at `t` with `demand` jobs, all of them in a slot."""
    return update_levels(
        levels, needed, t, BOOT_S, POLICY, demand=demand, running=demand, service_s=SERVICE_S
    )


def tick(levels: Levels, since: float, until: float, needed: int, demand: float) -> Levels:
    """Ticks every 2 s after `since` up to `until` with the same need and demand."""
    t = since
    while t < until:
        t = min(t + TICK_S, until)
        levels, _ = step(levels, needed, t, demand)
    return levels


def held_after(levels: Levels, since: float, now: float) -> int:
    """Workers held at `now` when two are needed (and 6 jobs are present)."""
    held = 0
    t = since
    while t < now:
        t = min(t + TICK_S, now)
        levels, held = step(levels, 2, t, 6.0)
    return held


def burst(levels: Levels, at: float, lasts_s: float) -> tuple[Levels, float]:
    """Three workers' work (12 jobs) from `at` for `lasts_s`, then 6 jobs until a boot after
    `at`; returns the levels then and when the burst ended."""
    levels, _ = step(levels, 3, at, 12.0)
    levels = tick(levels, at, at + lasts_s, 3, 12.0)
    return tick(levels, at + lasts_s, max(at + BOOT_S, at + lasts_s), 2, 6.0), at + lasts_s


def poisson(rng: random.Random, mean: float) -> float:
    """The count of a Poisson process of `mean` arrivals per bucket over one bucket."""
    n, t = 0, rng.expovariate(mean)
    while t < 1.0:
        n, t = n + 1, t + rng.expovariate(mean)
    return float(n)

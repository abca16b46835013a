"""The arrival rate read off the work present, tick by tick.

The models' rates (`models.recent_rate`, the forecast) come from complete 10 s buckets refit
every few seconds off the hot path: a surge that starts now shows in them a bucket or two
later. While workers boot for it, `backlog.py` sizes what more to start from the jobs
arriving over the boot; at the rate of the quiet minutes before the surge, the workers
already booting look like enough, and the queue grows for a boot before the next ones start.

The work present says it sooner. Over one tick the jobs present change by those that arrived
less those that ended, and the jobs in a slot end one per service time each: so the arrivals
over a tick are the change of the jobs present plus `running × dt / service_s`, counting the
jobs that were running at the tick before (a job that has just started ends later). That is
averaged over about a panic window (Knative's window for reacting to a surge), so one tick's
noise does not start a worker, and a surge counts within a few ticks.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from control_plane.domain.scaling.policy import PANIC_WINDOW_S


class Inflow(NamedTuple):
    """What one tick hands the next to measure the arrivals between them."""

    at: float  # when it was measured
    demand: int  # jobs present then (queued + running)
    running: int  # jobs in a slot then
    rate: float = 0.0  # arrivals per second, averaged over about a panic window


def observe(prev: Inflow | None, now: float, demand: int, running: int, service_s: float) -> Inflow:
    """The inflow after a tick at `now` that found `demand` jobs, `running` of them in a
    slot, each holding it `service_s` on average."""
    if prev is None or now <= prev.at:
        return Inflow(now, demand, running, 0.0 if prev is None else prev.rate)
    dt = now - prev.at
    # the jobs that ended over the tick: those in a slot at the last tick end one per service
    # time each; those started since have barely begun (counted as ending at that rate too, a
    # wave of workers becoming ready read as a surge, and started more workers for it)
    # (conditionals for max: every tick of every deployment runs this)
    ended = dt * prev.running / (1e-3 if service_s < 1e-3 else service_s)
    seen = demand - prev.demand + ended
    seen = (0.0 if seen < 0.0 else seen) / dt
    weight = 1.0 - math.exp(-dt / PANIC_WINDOW_S)
    # (built from its fields without the named tuple's own constructor: every tick runs this)
    return tuple.__new__(Inflow, (now, demand, running, prev.rate + weight * (seen - prev.rate)))

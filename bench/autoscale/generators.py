"""Arrival generators for the trace family (`family.py`): seeded functions that return the
arrival times of one deployment, in seconds from its start.

Every generator takes a `random.Random` (the caller seeds it) and its parameters, and returns
sorted times in [0, duration_s]. None knows anything about the autoscaler.

- `poisson`: a constant rate;
- `on_off`: bursts of a given size (each burst's size lognormal around it, its calls a Poisson
  stream at a rate log-uniform in 2..20 calls/s) separated by quiet gaps drawn from an
  exponential, log-normal or Pareto distribution with a given median, or uniform in a range,
  each gap clipped to 10 s..30 min;
- `periodic`: a batch every period (a cron job), each firing jittered by up to a share of it;
- `diurnal`: a sinusoidal rate, and `ramp`: up, flat, down;
- `flash_crowd`: a background rate with surges that jump to a peak and decay;
- `superpose`: the union of several generators' streams (mixtures).

Example:

    >>> import random
    >>> times = poisson(random.Random(0), rate=0.5, duration_s=600.0)
    >>> 250 < len(times) < 350, times == sorted(times)
    (True, True)
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable

# Quiet gaps of the on/off generator lie within these bounds: shorter than 10 s is one 10 s
# bucket (the burst goes on); longer than 30 min is longer than any keep-alive compared.
GAP_MIN_S = 10.0
GAP_MAX_S = 1800.0
# A burst's calls come at a rate log-uniform in this range (calls per second).
BURST_RATE = (2.0, 20.0)
# Each burst's size is lognormal around the generator's size, with this sigma (about ×/÷1.5).
BURST_SIZE_SIGMA = 0.4
# Shapes of the gap distributions, for a given median: the log-normal's sigma, Pareto's tail
# index (1.5: a finite mean, an infinite variance; heavier than any exponential).
LOGNORMAL_SIGMA = 1.0
PARETO_ALPHA = 1.5
GAP_DISTRIBUTIONS = ("exponential", "lognormal", "pareto", "uniform")
# A batch's calls are submitted at this rate (calls per second).
BATCH_RATE = 50.0

Arrivals = list[float]


def poisson(rng: random.Random, rate: float, duration_s: float, start_s: float = 0.0) -> Arrivals:
    """A Poisson stream of `rate` calls per second on [start_s, duration_s]."""
    times: Arrivals = []
    t = start_s
    while rate > 0:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        times.append(t)
    return times


def gap(rng: random.Random, distribution: str, median_s: float, spread: float = 0.5) -> float:
    """One quiet gap: `distribution` with median `median_s` (uniform: median ± spread × median),
    clipped to [GAP_MIN_S, GAP_MAX_S]."""
    if distribution == "exponential":
        g = rng.expovariate(math.log(2) / median_s)
    elif distribution == "lognormal":
        g = median_s * math.exp(rng.gauss(0.0, LOGNORMAL_SIGMA))
    elif distribution == "pareto":  # x_m × U^(-1/α), median x_m × 2^(1/α)
        g = median_s / 2 ** (1 / PARETO_ALPHA) * (1.0 - rng.random()) ** (-1 / PARETO_ALPHA)
    elif distribution == "uniform":
        g = rng.uniform(median_s * (1 - spread), median_s * (1 + spread))
    else:
        raise ValueError(f"unknown gap distribution {distribution!r}")
    return min(max(g, GAP_MIN_S), GAP_MAX_S)


def burst(rng: random.Random, start_s: float, size: int, rate: float) -> Arrivals:
    """`size` calls from `start_s` on, a Poisson stream at `rate` per second."""
    times: Arrivals = []
    t = start_s
    for _ in range(size):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def burst_size(rng: random.Random, size: float) -> int:
    return max(round(size * math.exp(rng.gauss(0.0, BURST_SIZE_SIGMA))), 1)


def on_off(
    rng: random.Random,
    size: float,
    distribution: str,
    median_gap_s: float,
    duration_s: float,
    exact_size: tuple[int, int] | None = None,
) -> Arrivals:
    """Bursts around `size` calls (`exact_size`: uniform in that range instead), each after a
    quiet gap (from the end of the last burst) drawn by `gap`."""
    times: Arrivals = []
    t = gap(rng, distribution, median_gap_s)
    while t < duration_s:
        n = rng.randint(*exact_size) if exact_size else burst_size(rng, size)
        rate = math.exp(rng.uniform(math.log(BURST_RATE[0]), math.log(BURST_RATE[1])))
        calls = burst(rng, t, n, rate)
        times += calls
        t = calls[-1] + gap(rng, distribution, median_gap_s)
    return [x for x in times if x <= duration_s]


def periodic(
    rng: random.Random, period_s: float, batch: int, jitter: float, duration_s: float
) -> Arrivals:
    """A batch of `batch` calls (submitted at BATCH_RATE) every `period_s`, each firing moved by
    up to ± `jitter` × the period; the first at a random phase."""
    times: Arrivals = []
    at = rng.uniform(0.0, period_s)
    while at < duration_s:
        fire = max(at + rng.uniform(-jitter, jitter) * period_s, 0.0)
        times += burst(rng, fire, batch, BATCH_RATE)
        at += period_s
    return sorted(x for x in times if x <= duration_s)


def by_rate(
    rng: random.Random, rate: Callable[[float], float], peak: float, duration_s: float
) -> Arrivals:
    """A Poisson stream of time-varying `rate(t)` ≤ `peak`, by thinning."""
    return [t for t in poisson(rng, peak, duration_s) if rng.random() * peak < rate(t)]


def diurnal(
    rng: random.Random, mean_rate: float, amplitude: float, period_s: float, duration_s: float
) -> Arrivals:
    """Rate mean × (1 + amplitude × sin(2πt / period + phase)), a day compressed to a period."""
    phase = rng.uniform(0.0, 2 * math.pi)

    def rate(t: float) -> float:
        return mean_rate * (1 + amplitude * math.sin(2 * math.pi * t / period_s + phase))

    return by_rate(rng, rate, mean_rate * (1 + amplitude), duration_s)


def ramp(rng: random.Random, peak_rate: float, duration_s: float) -> Arrivals:
    """From no calls to `peak_rate` over the first 40 % of the span, flat for 20 %, down over
    the last 40 %."""

    def rate(t: float) -> float:
        x = t / duration_s
        return peak_rate * min(x / 0.4, 1.0, (1.0 - x) / 0.4)

    return by_rate(rng, rate, peak_rate, duration_s)


def flash_crowd(
    rng: random.Random,
    background: float,
    peak: float,
    surges: int,
    decay_s: float,
    duration_s: float,
) -> Arrivals:
    """A background Poisson rate, and `surges` surges at random times (none in the first or
    last tenth): each jumps to `peak` calls/s and decays with time constant `decay_s`."""
    at = sorted(rng.uniform(0.1, 0.9) * duration_s for _ in range(surges))

    def rate(t: float) -> float:
        extra = sum(peak * math.exp(-(t - s) / decay_s) for s in at if t >= s)
        return background + extra

    return by_rate(rng, rate, background + peak * surges, duration_s)


def superpose(streams: Iterable[Arrivals]) -> Arrivals:
    """The union of sorted streams, sorted."""
    return list(heapq.merge(*streams))

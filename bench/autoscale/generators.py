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
- `superpose`: the union of several generators' streams (mixtures);
- `markov_modulated`: a Poisson stream whose rate jumps among a few values after exponential
  dwells (busy and quiet spells);
- `runs`: conversations (a few turns apart by a user's think time) and agent runs (a call
  after each call), each started as a Poisson stream;
- `self_exciting`: a Hawkes process (every call may bring more soon after it);
- `step`: a rate that changes once and stays; `with_outages`: a stream that stops and resumes;
- `trending_bursts` and `drifting_periodic`: bursts whose size, or batches whose period, move
  across the span; `renewal`: calls apart by heavy-tailed (Pareto) gaps, no bursts;
  `two_cycles`: a daily cycle with a faster one on top.

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


def burst_rate(rng: random.Random) -> float:
    """A burst's rate (calls per second), log-uniform in BURST_RATE."""
    return math.exp(rng.uniform(math.log(BURST_RATE[0]), math.log(BURST_RATE[1])))


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
        rate = burst_rate(rng)
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


def markov_modulated(
    rng: random.Random, rates: tuple[float, ...], dwell_s: float, duration_s: float
) -> Arrivals:
    """A Poisson stream whose rate is one of `rates`, drawn afresh (uniformly) after each
    exponential dwell of mean `dwell_s`."""
    times: Arrivals = []
    t = 0.0
    while t < duration_s:
        end = min(t + rng.expovariate(1 / dwell_s), duration_s)
        times += poisson(rng, rng.choice(rates), end, start_s=t)
        t = end
    return times


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def runs(
    rng: random.Random,
    start_rate: float,
    length: tuple[int, int],
    step_s: float,
    spread: float,
    duration_s: float,
) -> Arrivals:
    """Runs of calls started as a Poisson stream at `start_rate`, each run of a uniform number
    (`length`) of calls one after the other, `step_s` apart times a log-normal factor of sigma
    `spread`: a conversation's turns a user's think time apart (spread widely), or an agent's
    calls each as long after the last as a call takes (spread narrowly)."""
    times: Arrivals = []
    for t in poisson(rng, start_rate, duration_s):
        for _ in range(rng.randint(*length)):
            times.append(t)
            t += _lognormal(rng, step_s, spread)
    return sorted(x for x in times if x <= duration_s)


def self_exciting(
    rng: random.Random, base_rate: float, branching: float, decay_s: float, duration_s: float
) -> Arrivals:
    """A Hawkes process, drawn as clusters: calls of their own at `base_rate`, and each call
    brings a Poisson number (mean `branching` < 1) of calls after it, each an exponential delay
    (mean `decay_s`) later."""
    times = poisson(rng, base_rate, duration_s)
    parents = list(times)
    while parents:
        t = parents.pop()
        for _ in range(_poisson_count(rng, branching)):
            child = t + rng.expovariate(1 / decay_s)
            if child <= duration_s:
                times.append(child)
                parents.append(child)
    return sorted(times)


def _poisson_count(rng: random.Random, mean: float) -> int:
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n, t = n + 1, t + rng.expovariate(1.0)
    return n


def step(
    rng: random.Random, before: float, after: float, at_share: float, duration_s: float
) -> Arrivals:
    """A Poisson stream at `before` calls/s until `at_share` of the span, at `after` from then."""
    at = at_share * duration_s
    return poisson(rng, before, at) + poisson(rng, after, duration_s, start_s=at)


def with_outages(
    rng: random.Random, rate: float, outages: int, outage_s: float, duration_s: float
) -> Arrivals:
    """A Poisson stream that stops for `outage_s` at `outages` evenly spread times (a client's
    outage or a paused job) and resumes at full rate."""
    cuts = [(k + 1) / (outages + 1) * duration_s for k in range(outages)]
    return [
        t for t in poisson(rng, rate, duration_s) if not any(c <= t < c + outage_s for c in cuts)
    ]


def trending_bursts(
    rng: random.Random, size_from: float, size_to: float, median_gap_s: float, duration_s: float
) -> Arrivals:
    """On/off bursts (as `on_off`, log-normal gaps) whose size moves linearly from `size_from`
    to `size_to` across the span."""
    times: Arrivals = []
    t = gap(rng, "lognormal", median_gap_s)
    while t < duration_s:
        size = size_from + (size_to - size_from) * t / duration_s
        rate = burst_rate(rng)
        calls = burst(rng, t, burst_size(rng, size), rate)
        times += calls
        t = calls[-1] + gap(rng, "lognormal", median_gap_s)
    return [x for x in times if x <= duration_s]


def drifting_periodic(
    rng: random.Random, period_from: float, period_to: float, batch: int, duration_s: float
) -> Arrivals:
    """A batch of `batch` calls (at BATCH_RATE) every period, the period moving linearly from
    `period_from` to `period_to` across the span: no two gaps alike."""
    times: Arrivals = []
    at = rng.uniform(0.0, period_from)
    while at < duration_s:
        times += burst(rng, at, batch, BATCH_RATE)
        at += period_from + (period_to - period_from) * at / duration_s
    return sorted(x for x in times if x <= duration_s)


def renewal(rng: random.Random, scale_s: float, alpha: float, duration_s: float) -> Arrivals:
    """Calls apart by Pareto gaps (minimum `scale_s`, tail index `alpha`; below 1 the mean gap
    is infinite): long quiet spells between runs of close calls, with no burst structure."""
    times: Arrivals = []
    t = 0.0
    while True:
        t += scale_s * (1.0 - rng.random()) ** (-1 / alpha)
        if t > duration_s:
            return times
        times.append(t)


def two_cycles(
    rng: random.Random,
    mean_rate: float,
    period_s: float,
    inner_period_s: float,
    duration_s: float,
) -> Arrivals:
    """A daily cycle (±60 %, a day compressed to `period_s`) with a faster one on top (±35 %,
    `inner_period_s`: the hourly rhythm of scheduled work)."""
    phase = rng.uniform(0.0, 2 * math.pi)

    def rate(t: float) -> float:
        slow = 1 + 0.6 * math.sin(2 * math.pi * t / period_s + phase)
        return mean_rate * slow * (1 + 0.35 * math.sin(2 * math.pi * t / inner_period_s))

    return by_rate(rng, rate, mean_rate * 1.6 * 1.35, duration_s)

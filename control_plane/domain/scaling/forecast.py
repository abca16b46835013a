"""Arrival forecast for dense traffic: a local-linear-trend Kalman filter over arrivals per
bucket (the model NVIDIA Dynamo's planner uses), fitted off the hot path.

State: the arrival level per bucket and its slope per bucket. Observation noise is Poisson
(variance = the predicted level). The two process-noise variances are chosen per deployment by
the likelihood of its own history from a small grid, so nothing is tuned to a particular trace:
a steady stream gets a stiff level, a ramping one a fast-moving level and slope.

`decide()` never fits; it reads `Forecast.rate(t)`, a few multiplications.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from control_plane.domain.scaling.history import BUCKET_S

# Process noise, relative to the mean count per bucket: how far the level (and the slope) may
# move per bucket. The grid spans "all but constant" (1e-3) to "follows every bucket" (1.0).
LEVEL_NOISE_GRID = (1e-3, 1e-2, 1e-1, 1.0)
SLOPE_NOISE_GRID = (0.0, 1e-4, 1e-2)
# Fewer buckets than this (two minutes) and the filter has not settled: no forecast.
MIN_BUCKETS = 12
# The one-sided 99 % point of the standard normal: the dispersion test's (`Forecast.steady`).
DISPERSION_Z = 2.326


@dataclass(frozen=True, slots=True)
class Forecast:
    end_at: float  # end of the last bucket fitted (seconds since the epoch)
    level: float  # arrivals per bucket, at end_at
    slope: float  # change of the level per bucket
    p00: float  # state covariance (level, level)
    p01: float  # (level, slope)
    p11: float  # (slope, slope)
    q_level: float  # process noise of the level per bucket
    q_slope: float  # process noise of the slope per bucket
    # A Poisson stream at a rate that all but stays put: the likelihood picked the stiffest
    # level, and the counts scatter around it no more than Poisson counts do (their squared
    # innovations, each over the variance the filter predicted, average 1 for such a stream;
    # the test allows the 99 % point of that average's spread, 2/n per bucket on n buckets).
    # A batch every minute is stiff too (its level does not move), but its counts scatter
    # far more: not steady. A steady stream's swings are what Erlang's model describes
    # (`queueing.py`); `steady` is judged on some history at least (`fit_forecast`).
    steady: bool = False

    def rate(self, t: float) -> tuple[float, float]:
        """(mean, standard deviation) of the arrival rate per second at time `t`."""
        # (conditionals for max: every tick of a dense deployment reads the rate twice)
        h = (t - self.end_at) / BUCKET_S
        h = 0.0 if h <= 0.0 else h
        mean = self.level + h * self.slope
        var = (
            self.p00
            + 2 * h * self.p01
            + h * h * self.p11
            + h * self.q_level
            + h * (h + 1) * (2 * h + 1) / 6 * self.q_slope
        )
        mean = 0.0 if mean < 0.0 else mean
        var = 0.0 if var < 0.0 else var
        return mean / BUCKET_S, math.sqrt(var) / BUCKET_S


def fit_forecast(
    counts: Sequence[float],
    end_at: float,
    steady_buckets: int = MIN_BUCKETS,
    service_s: float = 0.0,
) -> Forecast | None:
    """Fit on arrivals per complete bucket (oldest first) ending at `end_at`; None when there is
    too little history or no traffic at all. `steady` is judged on `steady_buckets` at least.
    `service_s`: how long a call holds its slot (the time scale the rate is used at)."""
    if len(counts) < MIN_BUCKETS or not any(counts):
        return None
    mean = sum(counts) / len(counts)
    scale = max(mean, 1.0)
    # The decision multiplies the rate by a service time (Little's law). Calls shorter than a
    # bucket are concurrent with the calls of their own bucket: the level that follows the
    # last bucket says what the next calls find (a burst's rate while it lasts). Calls that
    # last several buckets are concurrent with the calls of all of them: the rate that counts
    # is the level across them. Counts that scatter from one bucket to the next more than
    # Poisson counts do (squared differences averaging twice the mean; a trend adds its slope
    # squared, small beside it) are then observed with that much more noise, and the level
    # does not follow them: after a batch of 30 calls every minute, the level that followed
    # its bucket (2.6 calls/s) times 40 s calls asked for 17 workers where the batch kept 4-5
    # busy, 2.7x keep-alive's worker-seconds.
    spread = 1.0
    if service_s > BUCKET_S:
        diffs = [(b - a) * (b - a) for a, b in itertools.pairwise(counts)]
        spread = sum(diffs) / len(diffs) / (2.0 * max(mean, 1e-9))
        spread = spread if spread > 1.0 else 1.0
    best: tuple[float, float, float, Forecast] | None = None
    for ql in LEVEL_NOISE_GRID:
        for qs in SLOPE_NOISE_GRID:
            loglik, dispersion, fc = _filter(counts, end_at, ql * scale, qs * scale, spread)
            if best is None or loglik > best[0]:
                best = (loglik, ql, dispersion, fc)
    assert best is not None
    _, ql, dispersion, fc = best
    n = len(counts) - 1  # the innovations
    steady = ql == LEVEL_NOISE_GRID[0] and dispersion <= 1.0 + DISPERSION_Z * math.sqrt(2.0 / n)
    steady = steady and len(counts) >= steady_buckets
    return dataclasses.replace(fc, steady=True) if steady else fc


def _filter(
    counts: Sequence[float], end_at: float, q_level: float, q_slope: float, spread: float = 1.0
) -> tuple[float, float, Forecast]:
    """(log-likelihood, mean squared innovation over the variance a Poisson count would have
    been predicted with, the fit), the observation noise `spread` × the level."""
    level, slope = float(counts[0]), 0.0
    p00, p01, p11 = max(level, 1.0), 0.0, 1.0
    loglik = squares = 0.0
    for y in counts[1:]:
        # predict: level += slope; covariance through F = [[1, 1], [0, 1]] plus process noise
        level, slope = level + slope, slope
        p00, p01, p11 = p00 + 2 * p01 + p11 + q_level, p01 + p11, p11 + q_slope
        # update with a Poisson-noise observation of the level
        r = max(level, 1.0)
        s = p00 + r * spread
        k0, k1 = p00 / s, p01 / s
        innovation = y - level
        normalised = innovation * innovation / s
        squares += innovation * innovation / (p00 + r)
        loglik -= 0.5 * (math.log(2 * math.pi * s) + normalised)
        level, slope = level + k0 * innovation, slope + k1 * innovation
        p00, p01, p11 = (1 - k0) * p00, (1 - k0) * p01, p11 - k1 * p01
    fc = Forecast(end_at, level, slope, p00, p01, p11, q_level, q_slope)
    return loglik, squares / (len(counts) - 1), fc

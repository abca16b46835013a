"""The slow half of the autoscaler: models refit from a deployment's history every few
seconds by a background task (the live reconciler's `scaling_models` refresher, the
simulator's refit event), never inside `decide()`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from control_plane.domain.scaling.forecast import MIN_BUCKETS, Forecast, fit_forecast
from control_plane.domain.scaling.history import BUCKET_S, ArrivalStats, boot_buckets
from control_plane.domain.scaling.idle import (
    PLAIN,
    IdleWindows,
    fit_idle_windows,
    wake_requests,
    wake_sizes,
)
from control_plane.domain.scaling.policy import ScalingPolicy, counted_boot_s

# "Recent" for the density test: the last five minutes of buckets.
RECENT_BUCKETS = 30
# Half the density at which decide() uses the forecast (one arrival per boot), so a stream
# thinning out keeps its forecast until decide() itself stops using it.
DENSE_ARRIVALS = 0.5

# Models older than this are not trusted (the refresher died or lags): decide() falls back to
# its reactive part and the plain window. Ten refresh periods of the live loop.
MAX_MODEL_AGE_S = 300.0


@dataclass(frozen=True, slots=True)
class Models:
    fitted_at: float  # seconds since the epoch
    forecast: Forecast | None  # None: too little history, or no traffic
    idle: IdleWindows
    # arrivals per second lately (`recent_rate`); None: no complete bucket yet
    recent_rate: float | None = None


NONE = Models(0.0, None, PLAIN)


def refit(stats: ArrivalStats, policy: ScalingPolicy, boot_s: float, service_s: float) -> Models:
    """The forecast (dense traffic only) and the idle windows, from the arrival history and the
    deployment's measured boot and service times (priors where none were measured)."""
    boot_s = counted_boot_s(policy, boot_s)
    dense = _dense(stats, boot_s)
    return Models(
        fitted_at=stats.at,
        forecast=fit_forecast(stats.counts, stats.buckets_end_at, steady_buckets(policy), service_s)
        if dense
        else None,
        idle=dataclasses.replace(
            fit_idle_windows(
                stats.gaps,
                boot_s,
                policy.cold_penalty_s,
                policy.scaledown_window_s,
                wake_requests(stats.counts, boot_s),
                service_s,
            ),
            wakes=wake_sizes(stats.counts, boot_s),
        ),
        recent_rate=recent_rate(stats.counts, boot_s),
    )


def steady_buckets(policy: ScalingPolicy) -> int:
    """The history a stream is called steady on at least (`Forecast.steady`): the scale-down
    window. The holds that a steady stream's swings do without reach that far, and a burst of
    a few minutes at one rate looks like a Poisson stream over its own minutes. (Judged on
    five minutes of a 500-call burst, the workers it had needed were released before the
    next burst, three minutes later, found them gone: 1 % of its calls colder than a
    keep-alive's.)"""
    return max(math.ceil(policy.scaledown_window_s / BUCKET_S), MIN_BUCKETS)


def recent_rate(counts: tuple[float, ...], boot_s: float) -> float | None:
    """Arrivals per second lately: the higher of the last bucket's rate and the last boot's
    (a wake after a pause is not averaged with the pause)."""
    if not counts:
        return None
    n = boot_buckets(boot_s)
    last = counts[-n:]
    return max(counts[-1], sum(last) / len(last)) / BUCKET_S


def _dense(stats: ArrivalStats, boot_s: float) -> bool:
    """Did the last few minutes bring at least one arrival per boot, as a stream does? `decide`
    uses the forecast only then; sparser deployments (most of a fleet) skip the fit, the
    refresher's main cost.

    Both the mean and the spread count: a Poisson stream of `DENSE_ARRIVALS` calls per boot
    leaves a boot's worth of buckets without a call e^-DENSE_ARRIVALS of the time, so at least
    1 − e^-DENSE_ARRIVALS of the boot-long windows of the last minutes hold one. A batch of
    200 calls every five minutes brings 20 per boot on average and leaves nine windows in ten
    empty: its calls are the idle windows' wakes, not a rate. (Fitted as a rate, the batch's
    bucket lifted the level for the buckets after it, and the forecast booted workers for a
    batch already served.)"""
    recent = stats.counts[-RECENT_BUCKETS:]
    if not recent or sum(recent) / (len(recent) * BUCKET_S) * boot_s < DENSE_ARRIVALS:
        return False
    span = min(boot_buckets(boot_s), len(recent))
    windows = len(recent) - span + 1  # boot-long windows, one ending at each bucket
    last_seen, occupied = -span, 0
    for i, count in enumerate(recent):
        if count:
            last_seen = i
        if i >= span - 1 and i - last_seen < span:
            occupied += 1
    return occupied >= (1.0 - math.exp(-DENSE_ARRIVALS)) * windows

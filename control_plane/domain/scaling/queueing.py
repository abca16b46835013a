"""How many workers a steady stream wants so that the waits they spare pay for them.

A stream of `rate` calls a second, each holding a slot `service_s`, keeps `rate × service_s`
slots busy on average (Little's law), but its calls come at random: with just enough slots,
every swing above the mean queues. Each worker added takes some of that queueing away, and
costs one worker-second per second. A caller's wait is priced as the cold start is
(`policy.py`: a caller waiting through a boot costs `cold_penalty_s`; a wait of a tenth of a
boot, a tenth of that), so a worker is worth adding while the caller-seconds of queueing it
spares each second, at that price, exceed the worker-second it costs.

The queueing is Erlang's delay model (M/M/c: Poisson arrivals, exponential service, c slots):
a call waits longer than t with probability C(c, a) × exp(−θt) (Erlang C, offered load
a = rate × service_s, θ = (c − a) / service_s). A wait within `queue_wait_s` is the owner's
allowance (every part of the decision lets so many jobs wait for the workers there); a call
that waits longer counts its whole wait: C × exp(−θq) × (q + 1/θ) caller-seconds per call, q
the allowance. Service times of LLM calls vary less than exponential ones, so the model
overstates the queue a little: a worker too many now and then, rather than a swing that
queues at the tail of the latency.

The jobs such a stream holds at once are Poisson too (M/G/∞): `poisson_quantile_of_max` is
how many the forecast part provisions for, at the quantile the cost rule picks
(`policy.under_quantile`), over the two ends of the boot horizon.
"""

from __future__ import annotations

import math
from statistics import NormalDist

# Above this mean concurrency the Poisson quantile is taken from its normal approximation
# (error well under one job), which keeps decide() a few microseconds at any load.
POISSON_EXACT_MAX = 50.0
# Erlang B is computed by its recursion over the slots, one step per slot: past this many
# slots (a stream of thousands of concurrent calls) the square-root staffing rule takes over,
# whose queueing is negligible at the price of a few workers more.
MAX_EXACT_SLOTS = 4096
# The recursion's slot counts as floats: a float-by-float step runs a fifth faster than one
# that converts an int (the same values: every count up to here is exact as a float).
_SLOTS = tuple(float(k) for k in range(MAX_EXACT_SLOTS + 1))


def workers_for_stream(
    rate: float,
    service_s: float,
    target: int,
    wait_price: float,
    max_workers: int,
    wait_s: float = 0.0,
) -> int:
    """The fewest workers of `target` slots past which one more spares less queueing (of the
    calls that wait longer than `wait_s`), priced at `wait_price` worker-seconds per
    caller-second, than the worker-second it costs."""
    load = rate * service_s
    if load <= 0.0:
        return 0
    m = max(math.floor(load / target) + 1, 1)  # the fewest that can keep up
    if m * target > MAX_EXACT_SLOTS:
        return min(math.ceil((load + 3.0 * math.sqrt(load)) / target), max_workers)
    if m > max_workers:
        return max_workers
    service_s = max(service_s, 1e-3)

    # Erlang B's recursion, one slot at a time, up to the m workers' slots; then a worker's
    # slots more at a time while the next worker pays for itself (the recursion runs once over
    # the slots: a busy stream's hundred steps are the bulk of this function's time)
    b = 1.0  # Erlang B with 0 slots
    slots, more = 0, m * target
    wait: float | None = None  # the mean wait with a worker fewer (None: m workers' is next)
    while True:
        # (past MAX_EXACT_SLOTS, as ints: a stream that starts near it may add workers past it)
        steps = (
            _SLOTS[slots + 1 : more + 1] if more <= MAX_EXACT_SLOTS else range(slots + 1, more + 1)
        )
        for k in steps:
            offered = load * b
            b = offered / (k + offered)
        slots = more
        # the mean wait past `wait_s` per call with these slots, Erlang B at them being b
        erlang_c = slots * b / (slots - load * (1.0 - b))
        theta = (slots - load) / service_s
        wait_more = erlang_c * math.exp(-theta * wait_s) * (wait_s + 1.0 / theta)
        if wait is not None:  # one worker more than m: does it pay for itself?
            if rate * (wait - wait_more) * wait_price <= 1.0:
                return m
            m += 1
            if m > max_workers:
                return max_workers
        wait = wait_more
        more = slots + target


_Z: dict[float, float] = {}


def normal_z(quantile: float) -> float:
    """The standard normal's `quantile` (cached: decide() asks for a few values only)."""
    z = _Z.get(quantile)
    if z is None:
        z = _Z[quantile] = NormalDist().inv_cdf(quantile)
    return z


def poisson_quantile_of_max(means: tuple[float, float], quantile: float, z: float) -> int:
    """`_poisson_quantile` of the larger mean: the larger quantile, as it grows with the mean
    within each of its two methods (either side of POISSON_EXACT_MAX; both where they differ)."""
    low, high = means if means[0] <= means[1] else (means[1], means[0])
    if (low > POISSON_EXACT_MAX) == (high > POISSON_EXACT_MAX):
        return _poisson_quantile(high, quantile, z)
    return max(_poisson_quantile(low, quantile, z), _poisson_quantile(high, quantile, z))


def _poisson_quantile(mean: float, quantile: float, z: float) -> int:
    """Smallest k with P(Poisson(mean) ≤ k) ≥ quantile: concurrent jobs of a Poisson stream."""
    if mean <= 0:
        return 0
    if mean > POISSON_EXACT_MAX:
        return math.ceil(mean + z * math.sqrt(mean))
    term = math.exp(-mean)
    cdf, k = term, 0.0  # (k a float: a float-by-float step is faster, with the same values)
    while cdf < quantile:
        k += 1.0
        term *= mean / k
        cdf += term
    return int(k)

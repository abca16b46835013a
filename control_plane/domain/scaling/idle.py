"""Keep-alive and pre-warm windows for sparse traffic, from the deployment's own recent gaps.

After each arrival the autoscaler may keep its worker for a while, or let it go and boot one
again shortly before the next arrival is likely. "Serverless in the Wild" (ATC'20) sets these
windows at the 5th and 99th percentiles of an idle-time histogram, with 10 % margins. Here the
histogram is the deployment's recent gaps (`history.ArrivalStats.gaps`), each idle one spread
to its neighbours (no fixed bins: a 25 % bin at 15 min is wider than a boot), and the windows
are the pair of least expected cost over it (idle worker-seconds plus cold starts, priced as in
`policy.py`) among the pairs that make no call cold which keeping the worker for the whole
scale-down window after each call would have served. That keep-alive is the rule with a
guarantee (the ski-rental rule for a cold start priced at the window) and the fallback while
the gaps are too few; what the past buys is idle time (a pre-warm for a period, a release for
pauses longer than the window) and warm calls beyond the window, never a colder call within
it. Percentile rules fall out as special cases (a sharp period gives a pre-warm just before
it), and nothing is tuned to a trace.

Fitting is vectorised over at most a few hundred candidates; it runs off the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from control_plane.domain.scaling.history import boot_buckets

# Below this many idle gaps (gaps a worker could sit idle through: longer than the service
# time) the distribution says little about the next one: the plain window.
MIN_GAPS = 10
# The paper's margins: be ready 10 % before the earliest gap planned for, keep 10 % past one.
EARLY_MARGIN = 0.9
LATE_MARGIN = 1.1
# ... unless the idle gaps so far all lie within those margins of each other: a period (a cron
# job). Three is the fewest that can show it: two gaps agree by chance far more often (two
# exponential gaps lie within the margins of each other one time in ten, three one in 110).
MIN_PERIOD_GAPS = 3


@dataclass(frozen=True, slots=True)
class IdleWindows:
    """Counted from the last arrival: be ready at `prewarm_s` (None: keep the worker from the
    arrival on) and keep it until `keepalive_s`."""

    prewarm_s: float | None
    keepalive_s: float
    representative: bool  # False: too few gaps; the caller's plain window applies
    expected_cost_s: float = 0.0  # worker-seconds per gap, for the decision log
    # Callers a cold start of the last worker makes wait, on average (`wake_requests`): the
    # price of releasing it is a boot plus this many penalties, whether or not the windows are
    # representative.
    wake_requests: float = 1.0
    # The callers of each recent wake, oldest first (`wake_sizes`): how many workers the next
    # wake wants is priced on these, not on their mean (a mean undershoots every wake larger
    # than the average one).
    wakes: tuple[float, ...] = ()
    # The idle gaps the windows were fitted on: the next is shorter than all of them one time
    # in this many + 1 (`shorter_chance`).
    idle_gaps: int = 0

    @property
    def shorter_chance(self) -> float:
        """The chance that the next idle gap is shorter than every one seen: of n + 1
        exchangeable gaps, the next is the shortest one time in n + 1."""
        return 1.0 / (self.idle_gaps + 1)

    @property
    def prewarms(self) -> bool:
        """The pre-warm plan: release the worker after its work, boot one ahead of the next
        call (else the keep-alive plan: keep it)."""
        return self.representative and self.prewarm_s is not None


PLAIN = IdleWindows(None, 0.0, representative=False)


def wake_requests(counts: Sequence[float], boot_s: float) -> float:
    """How many callers a cold start of the last worker makes wait, from arrivals per bucket
    (oldest first): over the buckets with arrivals after a boot's worth of empty ones (wakes: a
    released worker would be booting for them), the mean number of arrivals within a boot's
    worth of buckets from each. With no wake in the history (a stream that never paused for a
    boot), every bucket with arrivals stands for one. 1 with no arrival at all.

    One caller for a sparse deployment; for one called in bursts, the burst's rate times the
    boot: 24 calls that come together all wait through the boot one of them starts. A burst
    still going on at the end of the history is counted as far as it has come."""
    sizes = wake_sizes(counts, boot_s, last=None)
    return sum(sizes) / len(sizes) if sizes else 1.0


# The wakes kept to size the next one: as many as a level keeps episodes
# (`levels.EPISODES_KEPT`), the recent ones, so that the sizing follows a change of the bursts
# within a few of them.
WAKES_KEPT = 8


def wake_sizes(
    counts: Sequence[float], boot_s: float, last: int | None = WAKES_KEPT
) -> tuple[float, ...]:
    """The callers of each wake in the history (see `wake_requests`), oldest first; the `last`
    ones only (None: all)."""
    span = boot_buckets(boot_s)
    c = np.asarray(counts, dtype=np.float64)
    i = np.flatnonzero(c)
    if not i.size:
        return ()
    empty = np.concatenate(([0], np.cumsum(c == 0)))  # [n + 1]: empty buckets before each
    woken = (i >= span) & (empty[i] - empty[np.maximum(i - span, 0)] == span)
    starts = i[woken] if woken.any() else i
    if last is not None:
        starts = starts[-last:]
    window = np.concatenate(([0.0], np.cumsum(c)))
    return tuple(float(x) for x in window[np.minimum(starts + span, c.size)] - window[starts])


def fit_idle_windows(
    gaps: Sequence[float],
    boot_s: float,
    penalty_s: float,
    max_keepalive_s: float,
    wake: float = 1.0,
    busy_s: float = 0.0,
) -> IdleWindows:
    """The cheapest (pre-warm, keep-alive) pair over these gaps. `penalty_s` is the price of one
    caller's wait; a cold start makes `wake` callers wait (`wake_requests`); `busy_s`: how long
    a worker serves an arrival (the mean service time).

    Costs per gap g, in worker-seconds, with boot T and cold start C = T + penalty (the price of
    every caller a cold start makes wait):
    - kept from the arrival until b: g if g < b, else b + C;
    - released, booted at s = a − T, ready at a, kept until b (b − s ≤ the scale-down
      window): g if g < busy_s (the worker is still serving the last arrival: it is released
      only when its work ends), C if g < s; g − s + penalty if s ≤ g < a (the caller waits for
      the rest of the boot: any wait is a cold start); g − s if a ≤ g < b; b − s + C after.
    Without the first case, the calls that come together (a cron job's three requests 0.2 s
    apart) each counted as a cold start of a released worker, and a deployment called every
    four minutes was fitted no pre-warm at all: every call of it was cold.
    """
    penalty_s *= wake
    # Enough gaps, and enough time: the windows reach out to `max_keepalive_s`, and gaps that
    # span less than that (one burst's arrivals, a second apart) say nothing about whether a
    # caller comes back within it. Fitted on a burst, the windows released the worker the
    # moment its work ended. (The paper's histogram cannot do that: its bins are a minute.)
    # Only idle gaps count: a call that comes while the last is served says nothing about how
    # long a worker would wait idle. Counted, a burst's hundreds of short gaps made one long gap
    # "representative", and a pre-warm was fitted on that one sample.
    g = np.sort(np.asarray(gaps, dtype=np.float64))
    idle = g[g >= busy_s]
    periodic = idle.size >= MIN_PERIOD_GAPS and idle[-1] * EARLY_MARGIN <= idle[0] * LATE_MARGIN
    if (idle.size < MIN_GAPS and not periodic) or g.sum() < max_keepalive_s:
        return IdleWindows(None, 0.0, False, wake_requests=wake)
    # The next gap is not one of those seen: of n + 1 exchangeable gaps, it is the shortest one
    # time in n + 1, and the longest one time in n + 1. So the past gets two more, one at each
    # end, as far out as the paper's margins: a pre-warm ready exactly at the shortest gap seen
    # misses the next that comes earlier, and with few gaps and callers priced per wake that
    # miss can cost more than being ready a little sooner. (A scheduled batch of 100 calls was
    # pre-warmed for its earliest gap seen, 592 s, and missed the batches that came at 586 s.)
    # Nor does it come exactly at one of them: it falls between each two neighbours one time in
    # n + 1, anywhere between them. So the idle gaps seen are not points but the bounds of the
    # spans the next may fall in, each span as likely, spread evenly (`_Spread`). As points, a
    # bursty deployment's ten pauses, five of 64-240 s and five of 648 s or more, said that no
    # pause ends between 240 and 648 s: its workers, whose wake costs 65 callers a boot, were
    # released 264 s after each burst, where the scale-down window (600 s) was cheaper. (Gaps
    # shorter than a job are served by the worker still at it: those stay points.)
    # How much longer a new longest gap is, nothing seen says: it may end anywhere up to and
    # past the window, so the last span reaches past it. (Ended at the longest seen, the model
    # said no gap ends between it and the window, and a keep-alive just past the longest gap
    # made every new longest gap a cold call the window's keep-alive catches: a few per trace,
    # as gaps get longer records the way exchangeable samples do.)
    top = max(idle[-1], max_keepalive_s) * LATE_MARGIN
    knots = np.concatenate(([idle[0] * EARLY_MARGIN], idle, [top]))
    busy = g[g < busy_s]
    below = _Spread(busy, knots)
    n = below.total
    g = np.concatenate((busy, knots))  # the candidates, as before: the gaps and the two beyond
    cold = boot_s + penalty_s

    # candidate ends: no keeping, each gap and each gap with the late margin, the window
    ends = np.unique(
        np.minimum(np.concatenate(([0.0, max_keepalive_s], g, g * LATE_MARGIN)), max_keepalive_s)
    )
    w_b, g_b = below(ends)
    keep = g_b + (n - w_b) * (ends + cold)
    # No plan may make a call cold that keeping the worker for the whole window after each call
    # (`max_keepalive_s`, the owner's scale-down window) would have served: a plan is allowed
    # only if none of the spread gaps up to the window falls where it has no worker ready.
    # What the past buys is idle time, and warm calls beyond the window, never a colder call
    # within it. (Compared by counts instead, a plan that pre-warmed for the longest pauses
    # and missed the shorter ones was "as warm" on 13 gaps, and colder on the next 30.)
    window = np.array([max_keepalive_s])
    (w_window,), _ = below(window)
    rounding = 1e-9 * n

    def within(x: np.ndarray) -> np.ndarray:
        return below(np.minimum(x, max_keepalive_s))[0]

    keep[w_window - within(ends) > rounding] = np.inf
    i = int(np.argmin(keep))
    best = IdleWindows(None, float(ends[i]), True, float(keep[i]))
    # candidate pre-warm points: each gap and each gap with the early margin, after one boot
    starts = np.unique(np.concatenate((g, g * EARLY_MARGIN)))
    # A released worker stays away at least one boot: shorter gaps are kept through, since the
    # churn would buy less than a boot's worth of worker-seconds for a boot's risk.
    starts = starts[starts > 2 * boot_s]
    if starts.size:
        s = starts - boot_s
        w_s, g_s = below(s)
        w_a, g_a = below(starts)
        w_boot, g_boot = w_a - w_s, g_a - g_s
        w_busy, g_busy = below(np.minimum(busy_s, s))  # served by the worker still up
        head = g_busy + (w_s - w_busy) * cold + (g_boot - s * w_boot) + penalty_s * w_boot
        ends2 = np.unique(np.concatenate((g, g * LATE_MARGIN)))
        w_e, g_e = below(ends2)
        # rows: pre-warm points, columns: ends; the worker lives from s to the end
        a_, s_, e_ = starts[:, None], s[:, None], ends2[None, :]
        cost = (
            head[:, None]
            + (g_e[None, :] - g_a[:, None])
            - s_ * (w_e[None, :] - w_a[:, None])
            + (n - w_e[None, :]) * (e_ - s_ + cold)
        )
        cost[(e_ < a_) | (e_ - s_ > max_keepalive_s)] = np.inf
        # cold up to the window: from the end of the last work to the ready time, and after
        # the end
        head_cold = within(starts) - within(np.minimum(busy_s, s))
        colder = head_cold[:, None] + (w_window - within(ends2))[None, :]
        cost[colder > rounding] = np.inf
        r, c = np.unravel_index(int(np.argmin(cost)), cost.shape)
        if cost[r, c] < best.expected_cost_s:
            best = IdleWindows(float(starts[r]), float(ends2[c]), True, float(cost[r, c]))
    return IdleWindows(
        best.prewarm_s, best.keepalive_s, True, best.expected_cost_s / n, wake, idle_gaps=idle.size
    )


class _Spread:
    """The gaps as `fit_idle_windows` counts them: each gap shorter than a job where it is; the
    rest spread between neighbouring `knots` (sorted: the idle gaps and the two beyond them),
    each of their spans holding the same share, knots + 1 gaps' worth in all."""

    def __init__(self, points: np.ndarray, knots: np.ndarray) -> None:
        self.points = np.sort(points)
        self.point_sums = np.concatenate(([0.0], np.cumsum(self.points)))
        self.knots = knots
        self.share = knots.size / (knots.size - 1)  # each span's
        mids = (knots[:-1] + knots[1:]) / 2
        self.span_sums = np.concatenate(([0.0], np.cumsum(self.share * mids)))
        self.total = float(self.points.size + knots.size)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(count, sum) of the gaps below each x."""
        i = np.searchsorted(self.points, x, side="left")
        count, total = i.astype(np.float64), self.point_sums[i]
        k = self.knots
        spans = k.size - 1
        # the span x falls in (or the last one, beyond them all), and how far into it
        j = np.clip(np.searchsorted(k, x, side="left") - 1, 0, spans - 1)
        lo, width = k[j], k[j + 1] - k[j]
        inside = np.where(width > 0, (x - lo) / np.where(width > 0, width, 1.0), x > lo)
        frac = np.clip(inside, 0.0, 1.0)
        count = count + self.share * (j + frac)
        total = total + self.span_sums[j] + self.share * frac * (lo + frac * width / 2)
        return count, total

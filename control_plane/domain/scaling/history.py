"""What the autoscaler remembers about a deployment's traffic, as plain data.

- `ArrivalStats`: arrivals counted per `BUCKET_S` (the forecaster's input), the recent gaps
  between consecutive arrivals, with the longer pauses of further back (the idle windows'
  input), and the last arrival. The simulator
  builds it with `ArrivalHistory`; the live platform keeps the same counts in Redis
  (`services/scaling/arrivals.py`) and reads them back into the same shape.
- `ConcurrencyWindow`: demand (queued + running) sampled every tick, averaged over the stable
  and panic windows as Knative's KPA does.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from control_plane.domain.scaling.policy import PANIC_WINDOW_S, STABLE_WINDOW_S

# Arrivals are counted per 10 s: short enough that a ramp shows within one 30 s boot, long
# enough that a 1 req/s stream has ~10 arrivals per bucket (Poisson noise ~30 %).
BUCKET_S = 10.0
# One hour of buckets: the forecaster needs a few minutes to settle, an hour to see a trend.
MAX_BUCKETS = 360


def boot_buckets(boot_s: float) -> int:
    """The buckets a boot covers (at least one)."""
    return max(math.ceil(boot_s / BUCKET_S), 1)


# The last 256 gaps between arrivals feed the idle windows: enough for percentiles near the
# tails (1 % is 2–3 gaps), few enough that a deployment whose pattern changes is followed
# within a few hundred arrivals, and small enough to keep per deployment in Redis.
MAX_GAPS = 256
# ... but 256 gaps are counted in calls, not in time: a deployment whose pauses come between
# batches of a hundred calls (a job every 20 minutes) holds two of its pauses there, too few
# for the idle windows ever to learn them. So the pauses (gaps of IDLE_GAP_S or more) are also
# kept on their own, the last MAX_IDLE_GAPS of them, and those older than the last MAX_GAPS
# gaps are read back with them. 10 s, a bucket: a burst's gaps are shorter (the forecaster sees
# its calls as one stream), and a worker kept through a shorter gap costs less than one of its
# jobs. 64: the idle windows' 10 gaps several times over, and a day of a 20-minute schedule.
# The older gaps under 10 s are not kept, so the past as read back holds its long pauses and
# not its short ones: keeping a worker through a short gap costs little either way, and the
# recent short gaps (in the last MAX_GAPS) still weigh against releasing it.
IDLE_GAP_S = 10.0
MAX_IDLE_GAPS = 64


@dataclass(frozen=True, slots=True)
class ArrivalStats:
    """A snapshot of a deployment's arrivals at `at`."""

    at: float  # when the snapshot was taken (seconds since the epoch)
    buckets_end_at: float  # end of the newest complete bucket in `counts`
    counts: tuple[float, ...]  # arrivals per complete bucket, oldest first (≤ MAX_BUCKETS)
    # gaps between arrivals, oldest first: the idle gaps (≥ IDLE_GAP_S) from before the last
    # MAX_GAPS, then the last MAX_GAPS gaps (`merged_gaps`)
    gaps: tuple[float, ...]
    last_arrival_at: float | None  # None: never called


EMPTY = ArrivalStats(0.0, 0.0, (), (), None)


class ArrivalHistory:
    """Bounded arrival history of one deployment, in memory (the simulator's; the live
    platform's lives in Redis with the same bins)."""

    def __init__(self) -> None:
        self._buckets: deque[tuple[int, int]] = deque()  # (bucket index, count), ascending
        self._gaps: deque[float] = deque(maxlen=MAX_GAPS)
        self._idle_gaps: deque[float] = deque(maxlen=MAX_IDLE_GAPS)
        self.last_arrival_at: float | None = None

    def record(self, t: float, n: int = 1) -> None:
        """`n` arrivals at time `t` (not earlier than the previous ones)."""
        index = int(t // BUCKET_S)
        if self._buckets and self._buckets[-1][0] == index:
            self._buckets[-1] = (index, self._buckets[-1][1] + n)
        else:
            self._buckets.append((index, n))
            while self._buckets and self._buckets[0][0] <= index - MAX_BUCKETS:
                self._buckets.popleft()
        if self.last_arrival_at is not None:
            gap = t - self.last_arrival_at
            self._gaps.append(gap)
            if gap >= IDLE_GAP_S:
                self._idle_gaps.append(gap)
        self._gaps.extend([0.0] * (n - 1))
        self.last_arrival_at = t

    def stats(self, now: float) -> ArrivalStats:
        return stats_of(
            dict(self._buckets),
            tuple(self._gaps),
            tuple(self._idle_gaps),
            self.last_arrival_at,
            now,
        )


def merged_gaps(gaps: tuple[float, ...], idle_gaps: tuple[float, ...]) -> tuple[float, ...]:
    """The last gaps, after the idle gaps from before them. Both lists were written by the same
    arrivals, so the newest idle gaps are the ones among `gaps`: those are skipped."""
    recent = sum(1 for g in gaps if g >= IDLE_GAP_S)
    return idle_gaps[: max(len(idle_gaps) - recent, 0)] + gaps


def stats_of(
    bucket_counts: dict[int, int],
    gaps: tuple[float, ...],
    idle_gaps: tuple[float, ...],
    last_arrival_at: float | None,
    now: float,
) -> ArrivalStats:
    """Counts keyed by bucket index → the snapshot, complete buckets only; the last MAX_GAPS
    `gaps` after the idle ones from before them (`merged_gaps`)."""
    current = int(now // BUCKET_S)
    first = current - MAX_BUCKETS
    known = [i for i in bucket_counts if first <= i < current]
    start = min(known) if known else current
    counts = tuple(float(bucket_counts.get(i, 0)) for i in range(start, current))
    gaps = merged_gaps(tuple(gaps)[-MAX_GAPS:], tuple(idle_gaps)[-MAX_IDLE_GAPS:])
    return ArrivalStats(now, current * BUCKET_S, counts, gaps, last_arrival_at)


class ConcurrencyWindow:
    """Demand samples of the last stable window; the KPA's two averages."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque()

    def record(self, t: float, concurrency: float) -> None:
        self._samples.append((t, concurrency))
        while self._samples and self._samples[0][0] <= t - STABLE_WINDOW_S:
            self._samples.popleft()

    def averages(self, now: float) -> tuple[float, float]:
        """(stable, panic): mean demand over the last 60 s and the last 6 s."""
        stable = [c for t, c in self._samples if t > now - STABLE_WINDOW_S]
        panic = [c for t, c in self._samples if t > now - PANIC_WINDOW_S]
        return (
            sum(stable) / len(stable) if stable else 0.0,
            sum(panic) / len(panic) if panic else 0.0,
        )

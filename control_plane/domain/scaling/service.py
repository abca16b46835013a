"""How long a job holds a worker slot, measured on the deployment's recent jobs.

`decide()` multiplies a forecast arrival rate by this mean to get concurrency (Little's law)
and divides the ready slots by it to get how many jobs may wait (`policy.waits_allowed`), so an
error in it is an error in the worker count. The live refresher (`reconcile/refresh.py`) and
the simulator (`bench/autoscale/ours.py`) both measure it with `mean_service_s`.

The mean is taken over the jobs that ended within the last `SERVICE_WINDOW_S`, and over at
least the latest `MIN_SAMPLES`:
- a fixed count alone is noisy where traffic is dense: 20 jobs of a chat trace (lognormal
  lengths) are a few seconds of a busy deployment, and their mean has a standard error of
  about 16 %, so it swings from one refit to the next. In the simulator, on the Azure trace,
  a 20-job mean took 0.84× keep-alive's GPU-seconds and 22 boots where the window took 0.73×
  and 9 (`bench/autoscale_sim.py`, T_cold 30 s);
- a mean since the start lags when lengths change: the same trace's early jobs are longer, and
  its running mean stayed 14-54 % above the last minute's from t = 600 s to 1,700 s, so the
  forecast part asked for a worker more than the load needed.
"""

from __future__ import annotations

from collections.abc import Iterable

from control_plane.domain.scaling.history import BUCKET_S
from control_plane.domain.scaling.models import RECENT_BUCKETS

# The jobs that ended within the last five minutes: the "recent" of the forecast's density test
# (`models.RECENT_BUCKETS`). Job lengths drift over tens of minutes (the Azure trace's), and five
# minutes of a deployment with one job a second are 300 jobs, a standard error of ~4 %. A
# one-minute window, tried, tracked no better and its noise cost 6 % more GPU-seconds on the
# simulator's synthetic fleet, whose lengths do not drift (a worker asked for on a high reading
# is held for the ski-rental time; a low reading releases none sooner).
SERVICE_WINDOW_S = RECENT_BUCKETS * BUCKET_S
# A sparse deployment ends few jobs in five minutes: below this many the mean reaches further back.
# 20 lengths with the traces' coefficient of variation (0.5-0.7) give a standard error of
# 12-16 %: enough to tell a 2 s job from a 20 s one, which is what a sparse deployment needs.
MIN_SAMPLES = 20
# The most samples read per measurement, so a deployment ending thousands of jobs a minute costs
# a bounded read; 1,000 put the standard error of the mean near 2 %.
MAX_SAMPLES = 1000


def mean_service_s(recent: Iterable[tuple[float, float]], now: float) -> float | None:
    """Mean slot-holding seconds of `recent`: (ended at, seconds) per job, newest first, at most
    `MAX_SAMPLES` of them read. None: no job has ended yet."""
    since = now - SERVICE_WINDOW_S
    total, count = 0.0, 0
    for ended_at, seconds in recent:
        if (count >= MIN_SAMPLES and ended_at < since) or count >= MAX_SAMPLES:
            break
        total += seconds
        count += 1
    return total / count if count else None

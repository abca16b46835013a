"""How long a job holds a worker slot, measured on the deployment's recent jobs.

`decide()` multiplies a forecast arrival rate by this mean to get concurrency (Little's law)
and divides the ready slots by it to get how many jobs may wait (`policy.waits_allowed`), so an
error in it is an error in the worker count. The live refresher (`reconcile/refresh.py`) and
the simulator (`bench/autoscale/ours.py`) both measure it with `mean_service_s`.

The mean is taken over the jobs that ended within the last `SERVICE_WINDOW_S`, and over at
least the latest `MIN_SAMPLES`:
- a fixed count alone is noisy where traffic is dense: 20 jobs with lengths of coefficient of
  variation 0.7 (lognormal chat lengths) have a mean with a standard error of about 16 %, a
  few seconds of a busy deployment, so it swings from one refit to the next, and a worker asked
  for on a high reading is held for its ski-rental time;
- a mean since the start lags when lengths drift, as chat lengths do over tens of minutes.
"""

from __future__ import annotations

from collections.abc import Iterable

from control_plane.domain.scaling.history import BUCKET_S
from control_plane.domain.scaling.models import RECENT_BUCKETS

# The jobs that ended within the last five minutes: the "recent" of the forecast's density test
# (`models.RECENT_BUCKETS`), so that the rate and the service time it multiplies describe the
# same stretch of traffic. Five minutes of a deployment ending one job a second are 300 jobs, a
# standard error of ~4 %.
SERVICE_WINDOW_S = RECENT_BUCKETS * BUCKET_S
# A sparse deployment ends few jobs in five minutes: below this many the mean reaches further
# back. 20 lengths with a coefficient of variation of 0.5-0.7 give a standard error of 12-16 %:
# enough to tell a 2 s job from a 20 s one, which is what a sparse deployment needs.
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

"""One run's raw record → the numbers the report compares.

- cold-start rate: share of requests served by a worker that became ready after they arrived
  (``sim.py`` defines it; the same thing as "no ready worker could take it on arrival and it
  waited for a boot"), overall and its 75th percentile over deployments that had requests;
- queueing delay: arrival → start of service, p50 and p99, sync and async requests apart; and
  the sync p99 of requests arriving after ``WARMUP_S`` (every policy starts from zero workers,
  so on a dense trace the first boot's backlog alone sets the overall p99);
- GPU-seconds provisioned (every worker from start to stop, booting and draining included) and
  used (seconds a worker held ≥ 1 request); the number of boots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bench.autoscale.sim import RunRecord

WARMUP_S = 300.0


@dataclass(frozen=True, slots=True)
class RunResult:
    workload: str
    policy: str
    knob: str  # the swept knob and its value, e.g. "cold_penalty_s=60"
    t_cold_s: float
    requests: int
    cold_rate: float  # share of requests that waited for a boot
    cold_rate_p75: float  # p75 over deployments of their own cold rate (nan: one deployment)
    sync_p50_s: float  # queueing delay of sync requests (nan: none)
    sync_p99_s: float
    sync_p99_warm_s: float  # ... of sync requests arriving after WARMUP_S
    async_p50_s: float  # ... of async requests
    async_p99_s: float
    gpu_s: float  # provisioned worker-seconds
    used_gpu_s: float  # worker-seconds with ≥ 1 request
    boots: int
    end_s: float  # horizon of the run
    wall_s: float  # simulator wall time of the run


def summarize(
    record: RunRecord,
    *,
    workload: str,
    policy: str,
    knob: str,
    t_cold_s: float,
    num_deployments: int,
    wall_s: float,
) -> RunResult:
    arrival = np.asarray(record.arrival_s)
    delay = np.asarray(record.start_s) - arrival
    assert not np.isnan(delay).any(), "a request was never served"
    sync = np.asarray(record.sync, dtype=bool)
    cold = np.asarray(record.cold, dtype=bool)
    dep = np.asarray(record.deployment, dtype=np.int64)
    n = len(delay)
    if num_deployments > 1 and n:
        count = np.bincount(dep, minlength=num_deployments)
        colds = np.bincount(dep, weights=cold, minlength=num_deployments)
        has = count > 0
        p75 = float(np.percentile(colds[has] / count[has], 75))
    else:
        p75 = math.nan
    return RunResult(
        workload=workload,
        policy=policy,
        knob=knob,
        t_cold_s=t_cold_s,
        requests=n,
        cold_rate=float(cold.mean()) if n else 0.0,
        cold_rate_p75=p75,
        sync_p50_s=_pct(delay[sync], 50),
        sync_p99_s=_pct(delay[sync], 99),
        sync_p99_warm_s=_pct(delay[sync & (arrival > WARMUP_S)], 99),
        async_p50_s=_pct(delay[~sync], 50),
        async_p99_s=_pct(delay[~sync], 99),
        gpu_s=record.provisioned_s,
        used_gpu_s=record.used_s,
        boots=record.boots,
        end_s=record.end_s,
        wall_s=wall_s,
    )


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan

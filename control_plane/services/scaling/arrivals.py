"""Arrival history of each deployment in Redis: what the autoscaler's models are fitted on.

    record         at every admission (a run, a job, an OpenAI call, a batch line when it is
                   dispatched): one Lua script, atomic across API processes; a call to a
                   deployment with no worker also nudges the reconciler (`wait_for_work`)
    read           the history as `domain.scaling.history.ArrivalStats` (the refresher thread)
    last_arrivals  the latest arrival of many deployments in one round trip (every tick)
    take_peaks     the most jobs in flight at any admission since the last tick, and a fresh
                   count from the database's (every tick, two round trips)

Per deployment, four keys (`common/protocol.py`), the same bins as the simulator's
`ArrivalHistory`: arrivals per `BUCKET_S` bucket (at most `MAX_BUCKETS` fields), the last
`MAX_GAPS` gaps between arrivals, the last `MAX_IDLE_GAPS` of those at least `IDLE_GAP_S`
long, and the time of the latest arrival. Memory is bounded whatever the
traffic; every write renews a TTL, so a deleted (or long silent) deployment's keys expire.

Two more keys follow the work between the reconciler's ticks, which see only the work present
at each tick: the jobs in flight, counted up at each admission and down at each end
(`finish.py`), and their peak at an admission since the last tick. A burst that comes and is
served between two ticks shows there (keep-alive's clock restarts at every call; the
autoscaler's levels are renewed by that peak: `decide`). Each tick sets the count to the
database's, so an end or admission that Redis missed (a restart, a failed round trip) is
wrong until the next tick at most.

Times come from the caller's clock (the API's `AppContext.clock`, the reconciler's `now`), never
from Redis or `time.time()`, so tests that move the clock move arrivals with it.

NOTE: recording is best effort. The database holds the accepted job; a Redis failure here is
logged and the admission goes on (the autoscaler then sees one arrival fewer).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script

from common.protocol import (
    RECONCILER_NUDGE_KEY,
    arrival_buckets_key,
    arrival_gaps_key,
    arrival_idle_gaps_key,
    in_flight_key,
    last_arrival_key,
    peak_in_flight_key,
    scale_decision_key,
)
from control_plane.domain.scaling.history import (
    BUCKET_S,
    IDLE_GAP_S,
    MAX_BUCKETS,
    MAX_GAPS,
    MAX_IDLE_GAPS,
    ArrivalStats,
    stats_of,
)

log = logging.getLogger(__name__)

# A deployment silent this long forgets its history (the idle windows never look further back
# than `scaledown_window_s` ≤ one day, the forecast one hour).
ARRIVALS_TTL_S = 7 * 24 * 3600

# KEYS: buckets (hash), gaps (list), last arrival (string), idle gaps (list), the deployment's
# latest scaling decision (read), the reconciler's nudge (a list of at most one entry), the jobs
# in flight and their peak since the last tick (integers).
# ARGV: now (seconds since the epoch), arrivals at that time, BUCKET_S, MAX_BUCKETS, MAX_GAPS,
# TTL, IDLE_GAP_S, MAX_IDLE_GAPS. The gap to the previous arrival is pushed (to the idle gaps
# too when it is one), then one 0 per further arrival at `now` (as `ArrivalHistory.record`
# does); an arrival older than the latest (another API process's
# clock) counts in its bucket but moves neither the last arrival back nor a gap below 0.
_RECORD_LUA = """
local now = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local max_buckets = tonumber(ARGV[4])
local max_gaps = tonumber(ARGV[5])
local index = math.floor(now / tonumber(ARGV[3]))
local field = string.format('%d', index)
if redis.call('HINCRBY', KEYS[1], field, n) == n then
  -- a new bucket: drop the ones that fell out of the window (once per bucket, not per call)
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if tonumber(f) <= index - max_buckets then redis.call('HDEL', KEYS[1], f) end
  end
end
local last = redis.call('GET', KEYS[3])
if last then
  local gap = now - tonumber(last)
  if gap < 0 then gap = 0 end
  redis.call('RPUSH', KEYS[2], string.format('%.17g', gap))
  if gap >= tonumber(ARGV[7]) then
    redis.call('RPUSH', KEYS[4], string.format('%.17g', gap))
    redis.call('LTRIM', KEYS[4], -tonumber(ARGV[8]), -1)
  end
end
for _ = 2, math.min(n, max_gaps + 1) do redis.call('RPUSH', KEYS[2], '0') end
redis.call('LTRIM', KEYS[2], -max_gaps, -1)
if (not last) or tonumber(last) < now then redis.call('SET', KEYS[3], ARGV[1]) end
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[6]) end
local in_flight = redis.call('INCRBY', KEYS[7], n)
if in_flight > (tonumber(redis.call('GET', KEYS[8])) or 0) then
  redis.call('SET', KEYS[8], in_flight)
end
redis.call('EXPIRE', KEYS[7], ARGV[6])
redis.call('EXPIRE', KEYS[8], ARGV[6])
-- a call to a deployment with no worker (per its latest decision) wakes the reconciler now
local decision = redis.call('GET', KEYS[5])
local workers = 0
if decision then
  local ok, doc = pcall(cjson.decode, decision)
  if ok and type(doc) == 'table' then workers = tonumber(doc['actual']) or 0 end
end
if workers == 0 then
  redis.call('LPUSH', KEYS[6], '1')
  redis.call('LTRIM', KEYS[6], 0, 0)
  redis.call('EXPIRE', KEYS[6], 60)
end
return 1
"""


def record(r: redis.Redis, deployment_id: str, at: datetime, n: int = 1) -> bool:
    """`n` arrivals for a deployment at `at`; False (logged) when Redis failed."""
    if n <= 0:
        return True
    try:
        _record_script(r)(keys=_keys(deployment_id), args=_args(at, n))
    except redis.RedisError as exc:
        log.warning("arrival of deployment %s not recorded (Redis: %s)", deployment_id, exc)
        return False
    return True


def record_to(pipe: Pipeline, deployment_id: str, at: datetime) -> None:
    """One arrival, queued on `pipe` (an admission's wake-up: one round trip for both). The
    script by its hash alone (a Script in a pipeline would first ask whether Redis has it, a
    round trip of its own); `recorded` loads it when Redis had not (a restarted Redis)."""
    keys = _keys(deployment_id)
    pipe.evalsha(_RECORD_SHA, len(keys), *keys, *_args(at, 1))


def recorded(result: Any, r: redis.Redis, deployment_id: str, at: datetime) -> bool:
    """The pipeline's answer to `record_to` (raise_on_error=False), recorded again through the
    script when Redis did not know it; False (logged) when Redis failed."""
    if isinstance(result, redis.exceptions.NoScriptError):
        return record(r, deployment_id, at)
    if isinstance(result, Exception):
        log.warning("arrival of deployment %s not recorded (Redis: %s)", deployment_id, result)
        return False
    return True


def ended_to(pipe: Pipeline, deployment_id: str) -> None:
    """One job of the deployment that was in flight ended, queued on `pipe` (the end's
    announcement: one round trip for both)."""
    key = in_flight_key(deployment_id)
    pipe.decr(key)
    pipe.expire(key, ARRIVALS_TTL_S)


def _keys(deployment_id: str) -> list[str]:
    return [
        arrival_buckets_key(deployment_id),
        arrival_gaps_key(deployment_id),
        last_arrival_key(deployment_id),
        arrival_idle_gaps_key(deployment_id),
        scale_decision_key(deployment_id),
        RECONCILER_NUDGE_KEY,
        in_flight_key(deployment_id),
        peak_in_flight_key(deployment_id),
    ]


def _args(at: datetime, n: int) -> list[str | int]:
    # repr: the shortest text that parses back to the same double (Lua's tonumber included)
    return [
        repr(at.timestamp()),
        n,
        repr(BUCKET_S),
        MAX_BUCKETS,
        MAX_GAPS,
        ARRIVALS_TTL_S,
        repr(IDLE_GAP_S),
        MAX_IDLE_GAPS,
    ]


@functools.cache
def _record_script(r: redis.Redis) -> Script:
    """The script bound to a client, made once per client (admission is a hot path)."""
    return r.register_script(_RECORD_LUA)


_RECORD_SHA = hashlib.sha1(_RECORD_LUA.encode()).hexdigest()  # what Redis knows it by


# Nudged ticks are at least this far apart (a deployment that stays at zero, e.g. in a crash
# loop, must not turn every call into a tick).
MIN_NUDGED_GAP_S = 0.05


def nudge_reconciler(r: redis.Redis) -> None:
    """Ask the loop for a tick now (what the arrival script does for a call to a deployment
    with no worker): at most one nudge waits, and it expires unheard after a minute."""
    pipe = r.pipeline(transaction=False)
    pipe.lpush(RECONCILER_NUDGE_KEY, "1")
    pipe.ltrim(RECONCILER_NUDGE_KEY, 0, 0)
    pipe.expire(RECONCILER_NUDGE_KEY, 60)
    pipe.execute()


def wait_for_work(r: redis.Redis, timeout_s: float, last_tick: float) -> bool:
    """The reconciler's pause between ticks: until a nudge (True) or `timeout_s` (False).
    `last_tick`: time.monotonic() of the previous tick. Without Redis, a plain sleep."""
    started = time.monotonic()
    try:
        nudged = r.blpop([RECONCILER_NUDGE_KEY], timeout=max(timeout_s, 0.01)) is not None
    except redis.RedisError:
        time.sleep(max(timeout_s - (time.monotonic() - started), 0.0))
        return False
    if nudged:
        time.sleep(max(last_tick + MIN_NUDGED_GAP_S - time.monotonic(), 0.0))
    return nudged


def read(r: redis.Redis, deployment_id: str, now: datetime) -> ArrivalStats:
    """The deployment's arrival history at `now` (raises on a Redis failure)."""
    pipe = r.pipeline(transaction=True)  # one consistent snapshot of the four keys
    pipe.hgetall(arrival_buckets_key(deployment_id))
    pipe.lrange(arrival_gaps_key(deployment_id), 0, -1)
    pipe.lrange(arrival_idle_gaps_key(deployment_id), 0, -1)
    pipe.get(last_arrival_key(deployment_id))
    buckets, gaps, idle_gaps, last = pipe.execute()
    return stats_of(
        {int(k): int(v) for k, v in buckets.items()},
        tuple(float(g) for g in gaps),
        tuple(float(g) for g in idle_gaps),
        float(last) if last is not None else None,
        now.timestamp(),
    )


def last_arrivals(r: redis.Redis, deployment_ids: Sequence[str]) -> dict[str, float | None]:
    """deployment id → its latest arrival (seconds since the epoch; None: never called)."""
    if not deployment_ids:
        return {}
    values = r.mget([last_arrival_key(i) for i in deployment_ids])
    return {
        i: float(v) if v is not None else None for i, v in zip(deployment_ids, values, strict=True)
    }


# KEYS: the jobs in flight, their peak since the last tick. ARGV: the database's count now, TTL.
# Returns the peak (nil: no admission since) and starts the next: the count set to the
# database's, no peak yet.
_TAKE_PEAK_LUA = """
local peak = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('DEL', KEYS[2])
return peak
"""


def take_peaks(r: redis.Redis, in_flight: dict[str, int]) -> dict[str, int]:
    """deployment id → the most jobs it had in flight at an admission since the last call, or
    its count in `in_flight` (the database's now) where that is more; each deployment's count
    is then set to it, and its peak starts again. Two round trips for them all (the pipeline
    first makes sure that Redis has the script); raises on a Redis failure."""
    if not in_flight:
        return {}
    script = _take_peak_script(r)
    pipe = r.pipeline(transaction=False)
    for dep_id, count in in_flight.items():
        keys = [in_flight_key(dep_id), peak_in_flight_key(dep_id)]
        script(keys=keys, args=[count, ARRIVALS_TTL_S], client=pipe)
    peaks = pipe.execute()
    return {
        dep_id: max(count, int(peak) if peak is not None else 0)
        for (dep_id, count), peak in zip(in_flight.items(), peaks, strict=True)
    }


@functools.cache
def _take_peak_script(r: redis.Redis) -> Script:
    return r.register_script(_TAKE_PEAK_LUA)

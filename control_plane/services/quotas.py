"""Per-tenant quotas: requests/min and tokens/min token buckets in Redis, plus an in-flight cap.

Both buckets are checked and charged by ONE Lua script, atomically, with Redis' own clock, so
the limits hold across any number of API processes. Redis down: `quota_fail_open` decides —
open (default) admits the request and logs it (the database, not Redis, holds accepted work,
so availability wins over exact limits); closed answers 503.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import redis

from control_plane.errors import InvalidRequest, RateLimited, Unavailable
from control_plane.services.edge_cache import GENERATION_KEY
from worker.protocol import rate_limit_key

log = logging.getLogger(__name__)

# KEYS: request bucket, token bucket, the edge cache's generation. ARGV: per-minute limits and
# costs of each, then the generation the caller decided on ('' when it read it itself).
# A bucket holds up to `limit` units and refills at limit/60 per second. Returns
# {1, 0, 0} when both admit (and charges both), {-1, 0, 0} when the generation moved (charges
# nothing), else {0, ms until both would admit, index of the bucket that needs the longest
# wait (1 requests, 2 tokens)}.
_BUCKETS_LUA = """
if ARGV[5] ~= '' and (tonumber(redis.call('GET', KEYS[3])) or 0) ~= tonumber(ARGV[5]) then
  return {-1, 0, 0}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait_ms = 0
local binding = 0
local levels = {}
for i = 1, 2 do
  local limit = tonumber(ARGV[2 * i - 1])
  local cost = tonumber(ARGV[2 * i])
  local rate = limit / 60000.0
  local b = redis.call('HMGET', KEYS[i], 'level', 'ts')
  local level = tonumber(b[1]) or limit
  local ts = tonumber(b[2]) or now_ms
  level = math.min(limit, level + (now_ms - ts) * rate)
  levels[i] = level
  if cost > level then
    local need = math.ceil((cost - level) / rate)
    if cost > limit then need = -1 end
    if need < 0 or need > wait_ms then wait_ms = need; binding = i end
    if need < 0 then break end
  end
end
if wait_ms ~= 0 then return {0, wait_ms, binding} end
for i = 1, 2 do
  local limit = tonumber(ARGV[2 * i - 1])
  redis.call('HSET', KEYS[i], 'level', levels[i] - tonumber(ARGV[2 * i]), 'ts', now_ms)
  redis.call('PEXPIRE', KEYS[i], 120000)
end
return {1, 0, 0}
"""


class StaleView(Exception):
    """The edge cache's generation a call was decided on has moved (or could not be checked):
    nothing was charged; the caller decides again on a fresh view. Never reaches a client."""


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_min: int  # requests admitted per minute (bucket size and refill)
    tokens_per_min: int  # prompt + max_tokens admitted per minute
    max_in_flight: int  # jobs queued or running at once


class Quotas:
    def __init__(self, r: redis.Redis, fail_open: bool) -> None:
        self._redis = r
        self._script = r.register_script(_BUCKETS_LUA)
        self._fail_open = fail_open

    def admit(
        self,
        tenant_id: str,
        limits: Limits,
        tokens: int,
        in_flight: int,
        generation: int | None = None,
    ) -> None:
        """Charge one request and `tokens`; raise RateLimited (with retry_after_s) if over.

        `generation`: the edge cache's generation the caller decided on without reading it
        (`EdgeCache.recent_view`), checked in the same script: StaleView, nothing charged, when
        it moved or could not be checked."""
        if in_flight >= limits.max_in_flight:
            raise RateLimited(
                f"{in_flight} jobs are queued or running; the limit is {limits.max_in_flight}",
                limit=limits.max_in_flight,
                retry_after_s=1,
            )
        if tokens > limits.tokens_per_min:
            # no wait would ever admit it: a client error, not a "retry later" (a client that
            # retries 429s would otherwise retry it forever)
            raise InvalidRequest(
                f"this request needs {tokens} tokens (prompt + max_tokens), more than the "
                f"tenant's whole limit of {limits.tokens_per_min} per minute; lower max_tokens "
                "or shorten the prompt",
                limit=limits.tokens_per_min,
            )
        keys = [
            rate_limit_key(tenant_id, "requests"),
            rate_limit_key(tenant_id, "tokens"),
            GENERATION_KEY,
        ]
        expected = "" if generation is None else generation
        args = [limits.requests_per_min, 1, limits.tokens_per_min, tokens, expected]
        try:
            ok, wait_ms, binding = self._script(keys=keys, args=args)
        except redis.RedisError as exc:
            if generation is not None:  # unconfirmed: decided again, reading the database
                raise StaleView from exc
            if self._fail_open:
                log.warning("quota check skipped (Redis unavailable, fail-open): %s", exc)
                return
            raise Unavailable("rate limiting is unavailable; try again shortly") from exc
        if ok == -1:
            raise StaleView
        if not ok:
            retry_after_s = max(1, math.ceil(int(wait_ms) / 1000))
            tokens_bind = int(binding) == 2
            raise RateLimited(
                f"rate limit of {limits.requests_per_min} requests and "
                f"{limits.tokens_per_min} tokens per minute reached "
                f"({'tokens' if tokens_bind else 'requests'} per minute)",
                # The bucket the caller waits for (docs/api.md: every 429 names its limit).
                limit=limits.tokens_per_min if tokens_bind else limits.requests_per_min,
                retry_after_s=retry_after_s,
            )

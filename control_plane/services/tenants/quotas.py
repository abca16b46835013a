"""Per-tenant quotas: requests/min and tokens/min token buckets in Redis, plus an in-flight cap.

Both buckets are checked and charged by ONE Lua script, atomically, with Redis' own clock, so
the limits hold across any number of API processes. Redis down: `quota_fail_open` decides —
open (default) admits the request and logs it (the database, not Redis, holds accepted work,
so availability wins over exact limits); closed answers 503.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import NoScriptError

from common.protocol import EDGE_CACHE_GENERATION_KEY, rate_limit_key
from control_plane.errors import InvalidRequest, RateLimited, Unavailable

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

# What `_BUCKETS_LUA` answers when it charged both buckets, and when the generation moved.
ADMITTED = (1, 0, 0)
STALE = (-1, 0, 0)

# KEYS: request bucket, token bucket. ARGV: per-minute limits and costs of each, as charged.
# Gives the costs back, capped at the limits; the time of the last charge stays: from then on
# the bucket fills as if the refused call had never been charged (one that expired meanwhile
# is full anyway).
_REFUND_LUA = """
for i = 1, 2 do
  local level = tonumber(redis.call('HGET', KEYS[i], 'level'))
  if level then
    local limit = tonumber(ARGV[2 * i - 1])
    redis.call('HSET', KEYS[i], 'level', math.min(limit, level + tonumber(ARGV[2 * i])))
  end
end
return 1
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
        self._refund_script = r.register_script(_REFUND_LUA)
        self._fail_open = fail_open

    def admit(
        self,
        tenant_id: str,
        limits: Limits,
        tokens: int,
        count_in_flight: Callable[[], int | None],
        generation: int | None = None,
    ) -> None:
        """Charge one request and `tokens`; raise RateLimited (with retry_after_s) if over.

        `count_in_flight()` counts the tenant's queued and running jobs (the database), or says
        the call is not to be charged (None: a replay of an idempotent call). The script goes
        out before it and its answer is read after, so that Redis runs it while the database
        counts (each took a third of a millisecond of every admission, one after the other). A
        call the count refuses, or does not charge, is given back what the script charged.

        `generation`: the edge cache's generation the caller decided on without reading it
        (`EdgeCache.recent_view`), checked in the same script: StaleView, nothing charged, when
        it moved or could not be checked."""
        keys = [
            rate_limit_key(tenant_id, "requests"),
            rate_limit_key(tenant_id, "tokens"),
            EDGE_CACHE_GENERATION_KEY,
        ]
        expected = "" if generation is None else generation
        args = [limits.requests_per_min, 1, limits.tokens_per_min, tokens, expected]
        sent = self._send(keys, args)
        try:
            in_flight = count_in_flight()
        except BaseException:
            if sent is not None and self._answer(sent, keys, args) == ADMITTED:
                self._refund(keys, args)
            raise
        answer = self._answer(sent, keys, args)
        if isinstance(answer, redis.RedisError) and generation is not None:
            raise StaleView from answer  # unconfirmed: decided again, reading the database
        if answer == STALE:
            raise StaleView
        if in_flight is None or in_flight >= limits.max_in_flight:
            if answer == ADMITTED:
                self._refund(keys, args)
            if in_flight is None:
                return
            raise RateLimited(
                f"{in_flight} jobs are queued or running; the limit is {limits.max_in_flight}",
                limit=limits.max_in_flight,
                retry_after_s=1,
            )
        if tokens > limits.tokens_per_min:
            # no wait would ever admit it (the script charged nothing): a client error, not a
            # "retry later" (a client that retries 429s would otherwise retry it forever)
            raise InvalidRequest(
                f"this request needs {tokens} tokens (prompt + max_tokens), more than the "
                f"tenant's whole limit of {limits.tokens_per_min} per minute; lower max_tokens "
                "or shorten the prompt",
                limit=limits.tokens_per_min,
            )
        if isinstance(answer, redis.RedisError):
            if self._fail_open:
                log.warning("quota check skipped (Redis unavailable, fail-open): %s", answer)
                return
            raise Unavailable("rate limiting is unavailable; try again shortly") from answer
        ok, wait_ms, binding = answer
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

    def _send(self, keys: list[str], args: list[Any]) -> Any:
        """The script written on a connection of the pool, its answer left to read there;
        None when it could not be written (`_answer` then runs it the plain way). (redis-py's
        connections are untyped.)"""
        pool = self._redis.connection_pool
        try:
            conn: Any = pool.get_connection()
        except redis.RedisError:
            return None
        try:
            conn.send_command("EVALSHA", self._script.sha, len(keys), *keys, *args)
        except redis.RedisError:
            conn.disconnect()
            pool.release(conn)
            return None
        return conn

    def _answer(
        self, conn: Any, keys: list[str], args: list[Any]
    ) -> tuple[int, int, int] | redis.RedisError:
        """The script's answer, read where `_send` wrote it; run the plain way (loaded, with
        redis-py's retries) when nothing was written, when Redis did not have the script (it
        restarted), or when the connection turned out closed (so nothing ran); the error when
        Redis failed. Read once: the connection goes back to the pool."""
        if conn is not None:
            pool = self._redis.connection_pool
            try:
                ok, wait_ms, binding = conn.read_response()
                return int(ok), int(wait_ms), int(binding)
            except (NoScriptError, redis.ConnectionError):
                conn.disconnect()
            except redis.RedisError as exc:  # a timeout: the script may have run; not again
                conn.disconnect()
                return exc
            finally:
                pool.release(conn)
        try:
            ok, wait_ms, binding = self._script(keys=keys, args=args)
        except redis.RedisError as exc:
            return exc
        return int(ok), int(wait_ms), int(binding)

    def _refund(self, keys: list[str], args: list[Any]) -> None:
        """Give a refused call's charge back (best effort: a bucket refills within a minute)."""
        try:
            self._refund_script(keys=keys[:2], args=args[:4])
        except redis.RedisError as exc:
            log.warning("quota refund skipped (Redis: %s)", exc)

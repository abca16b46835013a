"""The reconciler's lease outside Kubernetes: a key in Redis (`RECONCILER_LEASE_KEY`) that
expires unless its holder renews it (the rules both leases follow: reconcile/lease.py)."""

from __future__ import annotations

import contextlib

import redis

from common.protocol import RECONCILER_LEASE_KEY
from control_plane.reconcile.lease import LeaseUnreachable

# Win when free, renew when ours, in one step (a GET then SET could give it to two replicas).
_HOLD = """
local v = redis.call('GET', KEYS[1])
if v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisLease:
    """The lease outside Kubernetes: a key that expires unless its holder renews it."""

    def __init__(self, r: redis.Redis, holder: str, lease_s: float) -> None:
        self.holder = holder
        self._ttl_ms = int(lease_s * 1000)
        self._hold = r.register_script(_HOLD)
        self._release = r.register_script(_RELEASE)

    def hold(self) -> bool:
        try:
            return bool(self._hold(keys=[RECONCILER_LEASE_KEY], args=[self.holder, self._ttl_ms]))
        except redis.RedisError as exc:
            raise LeaseUnreachable(str(exc)) from exc

    def release(self) -> None:
        with contextlib.suppress(redis.RedisError):  # unreleased, it expires by itself
            self._release(keys=[RECONCILER_LEASE_KEY], args=[self.holder])

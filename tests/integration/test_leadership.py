"""Several reconciler replicas: one leads through the lease (reconcile/lease.py), and a deposed
leader's fencing token (reconcile/fence.py) stops its writes and provider calls. Real Redis and
SQL (SQLite and PostgreSQL); the provider records what it is asked to do."""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import text

from common.protocol import RECONCILER_LEASE_KEY
from control_plane.db.models import Job, Worker
from control_plane.reconcile import fence
from control_plane.reconcile import loop as reconcile_loop
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.lease import Leadership
from control_plane.reconcile.lease_redis import RedisLease
from tests.integration.api_helpers import deploy, submit
from tests.integration.conftest import provider


def now() -> datetime:
    return datetime.now(UTC)


def leadership(loop: Reconciler, name: str, lease_s: float = 10.0, **kw: Any) -> Leadership:
    return Leadership(RedisLease(loop.env.redis, name, lease_s), loop.sessions, name, lease_s, **kw)


def worker_count(loop: Reconciler) -> int:
    with loop.sessions() as s:
        return s.query(Worker).count()


def job_status(loop: Reconciler, job_id: str) -> tuple[str, str | None]:
    with loop.sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.status, job.status_reason


@pytest.fixture(autouse=True)
def _no_lease(redis_client: Any) -> None:
    redis_client.delete(RECONCILER_LEASE_KEY)


def test_one_replica_leads_and_the_next_takes_over_with_a_newer_token(loop: Reconciler) -> None:
    a, b = leadership(loop, "a"), leadership(loop, "b")
    first = a.poll(now)
    assert first is not None
    assert b.poll(now) is None, "the lease is a's"
    assert a.poll(now) == first, "renewing keeps the token"
    a.release()
    second = b.poll(now)
    assert second is not None and second > first
    with loop.sessions() as s:
        assert fence.current(s)[:2] == (second, "b")


def test_a_lease_that_is_not_renewed_runs_out(loop: Reconciler) -> None:
    a, b = leadership(loop, "a", lease_s=3.0), leadership(loop, "b", lease_s=3.0)
    assert a.poll(now) is not None
    assert b.poll(now) is None
    loop.env.redis.pexpire(RECONCILER_LEASE_KEY, 50)  # what 3 s without a renewal would do
    time.sleep(0.1)
    assert b.poll(now) is not None
    assert a.poll(now) is None, "a learns it lost the lease at its next renewal"


def test_a_deposed_leader_neither_starts_workers_nor_touches_jobs(
    client: TestClient, keys: dict[str, str], loop: Reconciler
) -> None:
    deploy(client, keys["a"])
    job_id = submit(client, keys["a"])
    stale = fence.take(loop.sessions, "a", now())
    current = fence.take(loop.sessions, "b", now())  # b won the lease while a was paused
    with pytest.raises(fence.Deposed):
        loop.tick(now(), stale)
    assert provider(loop).started == []
    assert worker_count(loop) == 0
    assert job_status(loop, job_id) == ("queued", None)
    loop.tick(now(), current)
    assert len(provider(loop).started) == 1, "the leader with the current token acts"
    assert worker_count(loop) == 1
    assert job_status(loop, job_id) == ("starting", "no_capacity")


def test_the_loop_ticks_only_while_it_leads_and_steps_down_when_deposed(
    client: TestClient, keys: dict[str, str], loop: Reconciler
) -> None:
    stepped: list[str] = []
    a = leadership(loop, "a", on_step_down=lambda: stepped.append("a"))
    deploy(client, keys["a"])
    submit(client, keys["a"])
    stop = threading.Event()
    runner = threading.Thread(target=reconcile_loop.run, args=(loop, a, now, stop))
    loop.env.redis.set(RECONCILER_LEASE_KEY, "someone-else", px=60_000)  # another replica leads
    runner.start()
    try:
        time.sleep(1.5)
        assert provider(loop).started == [], "a follower never ticks"
        loop.env.redis.delete(RECONCILER_LEASE_KEY)
        deadline = time.monotonic() + 10
        while not provider(loop).started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(provider(loop).started) == 1, "it won the lease and scaled from zero"
        fence.take(loop.sessions, "someone-else", now())  # a newer leader, lease aside
        deadline = time.monotonic() + 10
        while not stepped and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stepped == ["a"]
    finally:
        stop.set()
        runner.join(timeout=20)
    assert not runner.is_alive()


def test_a_leader_rides_out_a_short_lease_store_outage_then_steps_down(
    loop: Reconciler,
) -> None:
    t = [100.0]
    a = leadership(loop, "a", lease_s=10.0, monotonic=lambda: t[0])
    token = a.poll(now)
    assert token is not None
    with socket.socket() as s:  # a port nothing listens on: the store is unreachable
        s.bind(("127.0.0.1", 0))
        dead = redis.Redis(port=s.getsockname()[1], socket_connect_timeout=0.5)
        a.lease = RedisLease(dead, "a", 10.0)
        t[0] = 105.0
        assert a.poll(now) == token, "5 s into a 10 s lease: still ours"
        t[0] = 109.0
        assert a.poll(now) is None, "within the safety margin of its end: step down"


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_new_token_waits_for_the_old_leaders_transaction_in_flight(loop: Reconciler) -> None:
    """PostgreSQL: the fence row stays locked by the old leader's open transaction, so the
    new leader's token comes after everything that transaction did."""
    old = fence.take(loop.sessions, "a", now())
    taken: list[int] = []
    with loop.sessions() as s:
        fence.fence(s, old)
        s.execute(text("SELECT 1"))  # begins the transaction: the fence row is now locked
        other = threading.Thread(target=lambda: taken.append(fence.take(loop.sessions, "b", now())))
        other.start()
        time.sleep(0.5)
        assert taken == [], "b waits while a's transaction is open"
        s.commit()
    other.join(timeout=10)
    assert taken == [old + 1]
    with loop.sessions() as s:
        fence.fence(s, old)
        with pytest.raises(fence.Deposed):
            s.execute(text("SELECT 1"))

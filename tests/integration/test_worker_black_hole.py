"""A worker's path to Redis turns into a black hole (a partition, a lost NAT entry: every
packet lost, no RST, nothing closes), through the fault suite's TCP proxy to a real
redis-server: the broker consumer, the warm-up's queue check and the heartbeat each give up
within a bound and work again once the path heals. Before the timeouts, the consumer hung
for good on its next command while the worker kept heartbeating as if idle."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from common.protocol import deployment_queue, worker_heartbeat_key
from control_plane.services.jobs.dispatch import dispatch_job
from tests.faults.tcp_proxy import FaultProxy
from tests.integration.test_dispatch import _runtime_on, holding_consumer, wait_for
from worker.runtime.broker import BROKER_SOCKET_TIMEOUT_S, jobs_waiting
from worker.runtime.lifecycle import REDIS_TIMEOUT_S

DROP_S = 3.0


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    """The worker's path to the test's redis-server."""
    parts = urlsplit(redis_url)
    with FaultProxy((parts.hostname or "", parts.port or 6379)) as p:
        yield p


def via(proxy: FaultProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0"


def test_a_consumer_outlives_a_black_hole(proxy: FaultProxy, redis_client: Any) -> None:
    """The ack of a job that finished while the path was dead goes into the hole: the consumer
    gives up on that connection, opens another once the path heals, and takes new wake-ups."""
    thread, seen, held = holding_consumer(via(proxy), deployment_queue("dep_hole"), until=2)
    dispatch_job(redis_client, "dep_hole", "job_before", "async")
    thread.start()
    wait_for(lambda: seen == ["job_before"])
    proxy.drop()
    held[0].ack()
    time.sleep(DROP_S)
    proxy.heal()
    dispatch_job(redis_client, "dep_hole", "job_after", "async")
    wait_for(lambda: seen == ["job_before", "job_after"], timeout_s=60)
    held[1].ack()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the consumer did not drain and return"


def test_the_warm_up_check_answers_through_a_black_hole(proxy: FaultProxy) -> None:
    """A cold start asks whether wake-ups wait; a dead path is "don't know", in bounded time."""
    proxy.drop()
    started = time.monotonic()
    assert not jobs_waiting(via(proxy), deployment_queue("dep_hole"))
    assert time.monotonic() - started < 3 * BROKER_SOCKET_TIMEOUT_S


def test_a_heartbeat_into_a_black_hole_fails_in_time(proxy: FaultProxy, redis_client: Any) -> None:
    """Within two command timeouts, well inside the heartbeat's TTL, so the next beat after
    the path heals keeps the worker alive."""
    rt, _ = _runtime_on(via(proxy), deployment_queue("dep_hole"))
    key = worker_heartbeat_key(rt.worker_id)
    rt._beat()
    assert redis_client.get(key) is not None
    redis_client.delete(key)
    proxy.drop()
    started = time.monotonic()
    rt._beat()  # logs a warning, returns
    assert time.monotonic() - started < 2 * REDIS_TIMEOUT_S + 1.5
    assert redis_client.get(key) is None
    proxy.heal()
    rt._beat()
    assert redis_client.get(key) is not None

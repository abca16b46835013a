"""Wake-ups go through the real broker: the control plane sends, the worker's consumer receives."""

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import redis

from common.protocol import UNACKED_INDEX_KEY, UNACKED_KEY, deployment_queue
from control_plane.embedded.processes import free_port, start_redis
from control_plane.services.jobs.dispatch import (
    dispatch_job,
    make_celery,
    queue_depth,
    unacked_wakeups,
)
from control_plane.settings import Settings
from tests.helpers import wait_for
from worker.runtime.broker import jobs_waiting
from worker.runtime.consumer import Delivery, consume


def test_sent_wake_ups_are_consumed_in_priority_order(redis_url: str, redis_client: Any) -> None:
    app = make_celery(Settings(redis_url=redis_url))
    queue = deployment_queue("dep_test")
    assert queue_depth(app, queue) == 0
    dispatch_job(redis_client, "dep_test", "job_batch", "batch")
    dispatch_job(redis_client, "dep_test", "job_async", "async")
    dispatch_job(redis_client, "dep_test", "job_sync", "sync")
    assert queue_depth(app, queue) == 3
    seen: list[str] = []

    def handle(delivery: Delivery) -> None:
        seen.append(delivery.job_id)
        delivery.ack()  # prefetch 1: the next wake-up comes only after this one is acked

    consume(redis_url, queue, 1, handle, lambda: len(seen) == 3, poll_s=0.1)
    assert seen == ["job_sync", "job_async", "job_batch"]
    assert queue_depth(app, queue) == 0


def test_a_slot_freed_is_taken_again_at_once(redis_url: str, redis_client: Any) -> None:
    """Every slot held: the consumer waits for an ack, not for its poll to run out. (kombu
    sleeps out the poll when its prefetch is full: that once capped a worker at `prefetch`
    jobs per poll.) The acks come from another thread, as a job's end does."""
    queue = deployment_queue("dep_full")
    for i in range(5):
        dispatch_job(redis_client, "dep_full", f"job_{i}", "async")
    delivered: list[float] = []
    acked: list[float] = []

    def handle(delivery: Delivery) -> None:
        delivered.append(time.monotonic())

        def finish() -> None:
            acked.append(time.monotonic())
            delivery.ack()

        threading.Timer(0.02, finish).start()

    # a poll far longer than an ack takes: each wait below is an ack's, not the poll's
    consume(redis_url, queue, 1, handle, lambda: len(delivered) == 5, poll_s=5.0)
    gaps = [d - a for a, d in zip(acked, delivered[1:], strict=False)]
    assert len(gaps) == 4
    assert max(gaps) < 0.5, f"a freed slot waited {max(gaps):.2f} s for the next delivery"


def test_a_consumer_outlives_a_broker_restart(tmp_path: Path) -> None:
    """redis-server SIGKILLed under a consuming worker and started again on the same port (with
    its AOF): the consumer reconnects, the job in flight is acked, and new wake-ups arrive."""
    port = free_port()
    server = start_redis(tmp_path, port, tmp_path / "redis.log", appendonly=True)
    url = server.extra["url"]
    thread, seen, held = holding_consumer(url, deployment_queue("dep_restart"), until=2)
    try:
        dispatch_job(redis.Redis.from_url(url), "dep_restart", "job_before", "async")
        thread.start()
        wait_for(lambda: seen == ["job_before"])
        time.sleep(1.2)  # the AOF (fsync every second) holds the delivery
        os.kill(server.pid, signal.SIGKILL)
        server.popen.wait(timeout=10)
        held[0].ack()  # the job finished while the broker was down
        time.sleep(1.0)  # the consumer sees the connection go
        server = start_redis(tmp_path, port, tmp_path / "redis.log", appendonly=True)
        dispatch_job(redis.Redis.from_url(url), "dep_restart", "job_after", "async")
        wait_for(lambda: seen == ["job_before", "job_after"])
        held[1].ack()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the consumer did not drain and return"
    finally:
        server.stop()


def test_a_delivery_is_noted_until_its_job_is_acked(redis_url: str, redis_client: Any) -> None:
    """While a job is held, its wake-up is noted as delivered in kombu's keys (the
    reconciler's sweep reads them); its ack removes the note."""
    queue = deployment_queue("dep_note")
    dispatch_job(redis_client, "dep_note", "job_noted", "async")
    thread, seen, held = holding_consumer(redis_url, queue, until=1)
    thread.start()
    wait_for(lambda: seen == ["job_noted"])
    wait_for(lambda: [u.job_id for u in unacked_wakeups(redis_client, time.time() + 1)] != [])
    assert [u.job_id for u in unacked_wakeups(redis_client, time.time() + 1)] == ["job_noted"]
    held[0].ack()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the consumer did not drain and return"
    assert redis_client.hlen(UNACKED_KEY) == 0 and redis_client.zcard(UNACKED_INDEX_KEY) == 0


def test_a_stopping_consumer_leaves_new_wake_ups_for_others(
    redis_url: str, redis_client: Any
) -> None:
    """Asked to stop while it waits on the queue, a consumer hands out nothing more: a wake-up
    that reaches it then goes back to the head of its list, for another worker."""
    queue = deployment_queue("dep_stop")
    seen: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=consume, args=(redis_url, queue, 1, lambda d: seen.append(d.job_id), stop.is_set)
    )
    thread.start()
    time.sleep(0.3)  # its BRPOP waits on the empty queue
    stop.set()
    dispatch_job(redis_client, "dep_stop", "job_for_another", "sync")
    thread.join(timeout=20)
    assert not thread.is_alive(), "the consumer did not return"
    assert seen == []
    assert redis_client.llen(queue) == 1, "the wake-up waits for another worker"
    assert redis_client.hlen(UNACKED_KEY) == 0


def test_a_broker_that_refuses_the_note_still_delivers(redis_url: str, redis_client: Any) -> None:
    """Redis out of memory refuses the delivery's note (ZADD, HSET) but not the BRPOP: the job
    is handed out all the same, its ack goes through, and the consumer stays in step."""
    queue = deployment_queue("dep_oom")
    dispatch_job(redis_client, "dep_oom", "job_oom_1", "async")
    dispatch_job(redis_client, "dep_oom", "job_oom_2", "async")
    policy = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", 1)
    try:
        thread, seen, held = holding_consumer(redis_url, queue, until=2)
        thread.start()
        wait_for(lambda: len(seen) == 2)
        for delivery in held:
            delivery.ack()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the consumer did not drain and return"
    finally:
        redis_client.config_set("maxmemory", 0)
        redis_client.config_set("maxmemory-policy", policy)
    assert sorted(seen) == ["job_oom_1", "job_oom_2"]
    assert redis_client.hlen(UNACKED_KEY) == 0


def holding_consumer(
    url: str, queue: str, until: int
) -> tuple[threading.Thread, list[str], list[Delivery]]:
    """A consumer on its thread (not started) that records each delivery's job id and holds
    the delivery for the test to ack later, from another thread, as a worker does; it drains
    and returns once `until` deliveries came."""
    seen: list[str] = []
    held: list[Delivery] = []

    def handle(delivery: Delivery) -> None:
        seen.append(delivery.job_id)
        held.append(delivery)

    thread = threading.Thread(
        target=consume, args=(url, queue, 4, handle, lambda: len(seen) == until), daemon=True
    )
    return thread, seen, held


def _runtime_on(redis_url: str, queue: str) -> tuple[Any, Any]:
    """A worker runtime on the real broker, its engine scripted and its control plane faked."""
    from common.messages import Assignment
    from tests.unit.test_engine import _engine
    from tests.unit.test_engine_worker_runtime import FakeControl
    from worker.runtime.lifecycle import WorkerRuntime
    from worker.settings import WorkerSettings

    assignment = Assignment("dep_w", 1, "file:///m", queue, 1)
    rt = WorkerRuntime(WorkerSettings(redis_url=redis_url), "wrk_w", "cpu", assignment)
    rt.control = FakeControl({})  # type: ignore[assignment]
    rt.engine, runner = _engine(lambda rid, i: 2)
    return rt, runner


def test_a_worker_warms_up_unless_wake_ups_wait_for_it(redis_url: str, redis_client: Any) -> None:
    """Started ahead of demand (empty queue) it warms up; on a cold start (a wake-up waits)
    the first job warms the engine instead: no `warming`, no warm-up pass."""
    app = make_celery(Settings(redis_url=redis_url))
    queue = deployment_queue("dep_w")
    ahead, runner = _runtime_on(redis_url, queue)
    ahead._warm_up_unless_jobs_wait(queue)
    assert ahead.control.states == ["warming"] and runner.steps  # type: ignore[attr-defined]

    dispatch_job(redis_client, "dep_w", "job_cold", "sync")
    cold, runner = _runtime_on(redis_url, queue)
    cold._warm_up_unless_jobs_wait(queue)
    assert cold.control.states == [] and not runner.steps  # type: ignore[attr-defined]
    assert queue_depth(app, queue) == 1, "the wake-up is left for the consumer"

    # a broker it cannot read: it warms up (the hint is only a hint)
    assert not jobs_waiting(f"redis://127.0.0.1:{free_port()}/0", queue)

"""Wake-ups go through the real broker: Celery sends, a kombu consumer (the worker's) receives."""

from typing import Any

from control_plane.services.dispatch import dispatch_job, make_celery, queue_depth
from control_plane.settings import Settings
from worker.protocol import deployment_queue
from worker.runtime.consumer import Delivery, consume


def test_sent_wake_ups_are_consumed_in_priority_order(redis_url: str, redis_client: Any) -> None:
    app = make_celery(Settings(redis_url=redis_url))
    queue = deployment_queue("dep_test")
    assert queue_depth(app, queue) == 0
    dispatch_job(app, "dep_test", "job_batch", "batch")
    dispatch_job(app, "dep_test", "job_async", "async")
    dispatch_job(app, "dep_test", "job_sync", "sync")
    assert queue_depth(app, queue) == 3
    seen: list[str] = []

    def handle(delivery: Delivery) -> None:
        seen.append(delivery.job_id)
        delivery.ack()  # prefetch 1: the next wake-up comes only after this one is acked

    consume(redis_url, queue, 1, handle, lambda: len(seen) == 3, poll_s=0.1)
    assert seen == ["job_sync", "job_async", "job_batch"]
    assert queue_depth(app, queue) == 0

"""Wake-up messages to workers through the Celery broker (DESIGN §5: the DB is the truth)."""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import Celery

from control_plane.domain.wakeups import Unacked, job_of
from control_plane.services import events
from control_plane.settings import Settings
from control_plane.tasks_api import CONTROL_QUEUE
from worker.protocol import (
    BROKER_TRANSPORT_OPTIONS,
    PRIORITY_OF_KIND,
    RUN_JOB_TASK,
    EventType,
    deployment_queue,
)
from worker.runtime import consumer

log = logging.getLogger(__name__)


def make_celery(settings: Settings) -> Celery:
    app = Celery("control_plane", broker=settings.redis_url, backend=None)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_create_missing_queues=True,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options=BROKER_TRANSPORT_OPTIONS,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=CONTROL_QUEUE,
        worker_hijack_root_logger=False,
    )
    return app


def dispatch_job(app: Celery, deployment_id: str, job_id: str, kind: str) -> None:
    """Send the wake-up for `job_id`; duplicates are harmless (claims are fenced)."""
    app.send_task(
        RUN_JOB_TASK,
        kwargs={"job_id": job_id},
        queue=deployment_queue(deployment_id),
        priority=PRIORITY_OF_KIND.get(kind, PRIORITY_OF_KIND["async"]),
    )


def queue_depth(app: Celery, queue: str) -> int:
    """Messages waiting in a broker queue (0 when the queue does not exist yet)."""
    with app.connection_for_read() as conn:
        return consumer.queue_depth(conn, queue)


def wake(
    r: redis.Redis,
    app: Celery,
    deployment_id: str,
    job_id: str,
    kind: str,
    event: dict[str, Any] | None = None,
) -> bool:
    """Announce a committed job on its event stream and send its wake-up; False if that failed.

    Best effort by design: the row is already committed, and the loop's redispatch re-sends
    wake-ups for pending jobs whose queue is empty, so a broker outage loses nothing.
    """
    try:
        events.publish(r, job_id, EventType.QUEUED, event or {"job_id": job_id})
        dispatch_job(app, deployment_id, job_id, kind)
    except Exception:
        log.exception("wake-up for job %s failed; left for the redispatch", job_id)
        return False
    return True


# kombu's Redis transport keeps delivered, unacked messages here (its default key names).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
_PAGE = 1000


def unacked_wakeups(r: redis.Redis, delivered_before: float) -> list[Unacked]:
    """Job wake-ups delivered before `delivered_before` (epoch s) and not acked yet."""
    out: list[Unacked] = []
    offset = 0
    while True:
        scored: list[tuple[bytes | str, float]] = r.zrangebyscore(  # type: ignore[assignment]
            UNACKED_INDEX_KEY, "-inf", delivered_before, start=offset, num=_PAGE, withscores=True
        )
        if not scored:
            return out
        raws: list[bytes | None] = r.hmget(UNACKED_KEY, [t for t, _ in scored])  # type: ignore[assignment]
        for (tag, score), raw in zip(scored, raws, strict=True):
            job_id = job_of(raw) if raw is not None else None  # None: acked meanwhile
            if job_id is not None:
                out.append(Unacked(_text(tag), float(score), job_id))
        offset += len(scored)


def forget_unacked(r: redis.Redis, tags: list[str]) -> None:
    """Drop unacked entries for good: kombu will not deliver them again; a late ack of one is
    a no-op."""
    for i in range(0, len(tags), _PAGE):
        page = tags[i : i + _PAGE]
        pipe = r.pipeline(transaction=False)
        pipe.hdel(UNACKED_KEY, *page)
        pipe.zrem(UNACKED_INDEX_KEY, *page)
        pipe.execute()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

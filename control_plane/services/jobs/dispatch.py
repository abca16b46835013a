"""Wake-up messages to workers through the Celery broker (DESIGN §5: the DB is the truth)."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from datetime import datetime
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import ChannelError

from common.protocol import (
    BROKER_TRANSPORT_OPTIONS,
    HANDOFF_TTL_S,
    PRIORITY_OF_KIND,
    RUN_JOB_TASK,
    UNACKED_INDEX_KEY,
    UNACKED_KEY,
    EventType,
    deployment_queue,
    priority_key,
    worker_handoffs_key,
)
from control_plane.domain.wakeups import Unacked, control_task_eta, job_of
from control_plane.services.jobs import events
from control_plane.services.jobs.handoff import HandOff
from control_plane.services.scaling import arrivals
from control_plane.settings import Settings
from control_plane.tasks_api import CONTROL_QUEUE

log = logging.getLogger(__name__)


# kombu's Redis transport, fixed so that the Celery worker outlives a broker restart
# (broker_transport.py); a TLS broker (`rediss://`) keeps kombu's own, which sets up its TLS.
BROKER_TRANSPORT = "control_plane.broker_transport:Transport"


def make_celery(settings: Settings) -> Celery:
    app = Celery("control_plane", broker=settings.redis_url, backend=None)
    if settings.redis_url.startswith("redis://"):
        app.conf.broker_transport = BROKER_TRANSPORT
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


def dispatch_job(r: redis.Redis, deployment_id: str, job_id: str, kind: str) -> None:
    """Send the wake-up for `job_id`; duplicates are harmless (claims are fenced)."""
    r.lpush(*wakeup(deployment_id, job_id, kind))


def wakeup(deployment_id: str, job_id: str, kind: str) -> tuple[str, bytes]:
    """(Redis list, message) of a job's wake-up: a Celery protocol-v2 task message for
    RUN_JOB_TASK in kombu's Redis envelope, exactly what `Celery.send_task` writes there
    (the worker reads it as kombu would: `worker/runtime/consumer.py`). Built here because
    Celery's producer spends ~1 ms of CPU per message, on every admission, and takes a round
    trip of its own."""
    queue = deployment_queue(deployment_id)
    priority = PRIORITY_OF_KIND.get(kind, PRIORITY_OF_KIND["async"])
    task_id = str(uuid.uuid4())
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    body = [[], {"job_id": job_id}, embed]
    message = {
        "body": base64.b64encode(json.dumps(body).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": RUN_JOB_TASK,
            "id": task_id,
            "root_id": task_id,
            "parent_id": None,
            "group": None,
            "retries": 0,
            "timelimit": [None, None],
            "argsrepr": "()",
            "kwargsrepr": repr({"job_id": job_id}),
        },
        "properties": {
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": priority,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return priority_key(queue, priority), json.dumps(message).encode()


def queue_depth(app: Celery, queue: str) -> int:
    """Messages waiting in a broker queue, every priority (0 when it does not exist yet)."""
    with app.connection_for_read() as conn:
        try:
            declared = conn.default_channel.queue_declare(queue=queue, passive=True)
        except ChannelError:
            return 0
        return int(declared.message_count)


def wake(
    r: redis.Redis,
    deployment_id: str,
    job_id: str,
    kind: str,
    event: dict[str, Any] | None = None,
    *,
    arrival: datetime | None = None,
    handoff: HandOff | None = None,
) -> bool:
    """Announce a committed job on its event stream and send its wake-up (one round trip);
    False if that failed. With `arrival`, the admission's arrival is recorded in the same
    round trip (`arrivals.record_to`; best effort, logged).

    Best effort by design: the row is already committed, and the loop's redispatch re-sends
    wake-ups for pending jobs whose queue is empty, so a broker outage loses nothing. With
    `handoff`, the job was claimed for a worker in the admission's transaction: it is announced
    running and pushed to that worker (one that never gets it is requeued: handoff.py).
    """
    try:
        pipe = r.pipeline(transaction=False)
        events.publish_to(pipe, [job_id], EventType.QUEUED, event or {"job_id": job_id})
        if handoff is None:
            pipe.lpush(*wakeup(deployment_id, job_id, kind))
        else:  # claimed for its worker already: announced as a claim's is, sent to the worker
            data = {"attempt": handoff.job.attempt, "worker_id": handoff.worker_id}
            events.publish_to(pipe, [job_id], EventType.RUNNING, data)
            key = worker_handoffs_key(handoff.worker_id)
            pipe.lpush(key, handoff.message)
            pipe.expire(key, HANDOFF_TTL_S)
        if arrival is not None:
            arrivals.record_to(pipe, deployment_id, arrival)
        results = pipe.execute(raise_on_error=False)
    except Exception as exc:
        log.exception("wake-up for job %s failed; left for the redispatch", job_id)
        if arrival is not None:
            log.warning("arrival of deployment %s not recorded (Redis: %s)", deployment_id, exc)
        return False
    if arrival is not None:
        arrivals.recorded(results.pop(), r, deployment_id, arrival)
    failed = next((res for res in results if isinstance(res, Exception)), None)
    if failed is not None:
        log.error("wake-up for job %s failed (%s); left for the redispatch", job_id, failed)
        return False
    return True


_PAGE = 1000


def unacked_wakeups(r: redis.Redis, delivered_before: float) -> list[Unacked]:
    """Job wake-ups and control-plane tasks delivered before `delivered_before` (epoch s) and
    not acked yet."""
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
            if raw is None:
                continue  # acked meanwhile
            if (job_id := job_of(raw)) is not None:
                out.append(Unacked(_text(tag), float(score), job_id))
            elif (eta := control_task_eta(raw)) is not None:
                out.append(Unacked(_text(tag), float(score), None, eta))
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

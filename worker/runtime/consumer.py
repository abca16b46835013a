"""Queue consumer: Celery protocol-v2 messages on a deployment queue, acknowledged late.

The worker does not run a Celery worker: it needs its own lifecycle (load before consuming,
drain on SIGTERM) and, later, many jobs in flight inside one engine. kombu gives exactly the
broker part: prefetch = jobs the worker may hold, ack only after the job's result is stored.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

from kombu import Connection, Exchange, Message, Queue

from worker.protocol import BROKER_TRANSPORT_OPTIONS, RUN_JOB_TASK

log = logging.getLogger(__name__)


def job_id_of(body: Any, headers: dict[str, Any]) -> str | None:
    """Job id of a Celery protocol-v2 message `[args, kwargs, embed]` for RUN_JOB_TASK."""
    if headers.get("task") != RUN_JOB_TASK:
        return None
    if isinstance(body, list | tuple) and len(body) >= 2 and isinstance(body[1], dict):
        job_id = body[1].get("job_id")
        return str(job_id) if job_id else None
    return None


def consume(
    broker_url: str,
    queue_name: str,
    prefetch: int,
    handle: Callable[[str], None],
    should_stop: Callable[[], bool],
    poll_s: float = 0.5,
) -> None:
    """Feed job ids to `handle` until `should_stop()`; each message is acked after handle."""
    queue = Queue(queue_name, Exchange(queue_name, "direct"), routing_key=queue_name)
    received: deque[Message] = deque()
    with (
        Connection(broker_url, transport_options=BROKER_TRANSPORT_OPTIONS) as conn,
        conn.Consumer(
            [queue],
            callbacks=[lambda _body, message: received.append(message)],
            prefetch_count=prefetch,
            accept=["json"],
        ),
    ):
        while not should_stop():
            with contextlib.suppress(TimeoutError, socket.timeout):
                conn.drain_events(timeout=poll_s)
            while received:
                message = received.popleft()
                job_id = job_id_of(message.decode(), message.headers or {})
                if job_id is None:
                    log.warning("dropping unknown message on %s", queue_name)
                else:
                    handle(job_id)
                # NOTE: ack after handle returned: the job's outcome is stored by then.
                message.ack()

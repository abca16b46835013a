"""Queue consumer: Celery protocol-v2 messages on a deployment queue, acknowledged late.

The worker does not run a Celery worker: it needs its own lifecycle (load before consuming,
drain on SIGTERM) and many jobs in flight inside one engine. kombu gives exactly the broker
part: prefetch = jobs the worker may hold, ack only after the job's result is stored.

NOTE: kombu connections are not thread-safe. Jobs finish on other threads, so a ``Delivery``'s
``ack()`` only queues the message; the consumer's own thread acknowledges it on its next turn.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
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


def priority_of(properties: dict[str, Any]) -> int:
    """The message's broker priority (0 = served first: sync; then async, batch)."""
    try:
        return max(0, int(properties.get("priority") or 0))
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One job handed to the worker; ``ack()`` exactly once when its outcome is stored."""

    # the job to claim
    job_id: str
    # broker priority of the wake-up (lower first)
    priority: int
    # thread-safe: queues the acknowledgement for the consumer's thread
    ack: Callable[[], None]


def consume(
    broker_url: str,
    queue_name: str,
    prefetch: int,
    handle: Callable[[Delivery], None],
    should_stop: Callable[[], bool],
    poll_s: float = 0.1,
) -> None:
    """Hand deliveries to ``handle`` until ``should_stop()``, then drain.

    ``handle`` returns at once (the job runs elsewhere) and calls ``delivery.ack()`` later,
    from any thread. At most ``prefetch`` deliveries are unacknowledged at a time. Once
    ``should_stop()`` is true no new work is taken (messages that arrive are requeued for
    other workers) and this returns when every delivery handed out has been acknowledged.
    """
    broker_queue = Queue(queue_name, Exchange(queue_name, "direct"), routing_key=queue_name)
    received: deque[Message] = deque()
    done: queue.SimpleQueue[Message] = queue.SimpleQueue()
    outstanding = 0
    stopping = False
    with (
        Connection(broker_url, transport_options=BROKER_TRANSPORT_OPTIONS) as conn,
        conn.Consumer(
            [broker_queue],
            callbacks=[lambda _body, message: received.append(message)],
            prefetch_count=prefetch,
            accept=["json"],
        ) as consumer,
    ):
        while True:
            if not stopping and should_stop():
                stopping = True
                with contextlib.suppress(Exception):
                    consumer.cancel()  # no new deliveries
            if stopping:
                if outstanding == 0 and not received:
                    return
                with contextlib.suppress(queue.Empty):
                    done.put(done.get(timeout=poll_s))  # wait for a finished job
            else:
                with contextlib.suppress(TimeoutError, socket.timeout):
                    conn.drain_events(timeout=poll_s)
            while received:
                message = received.popleft()
                job_id = job_id_of(message.decode(), message.headers or {})
                if stopping:
                    message.requeue()  # not ours to start any more: back for another worker
                elif job_id is None:
                    log.warning("dropping unknown message on %s", queue_name)
                    message.ack()
                else:
                    outstanding += 1
                    priority = priority_of(message.properties or {})
                    _handle(handle, Delivery(job_id, priority, _acker(done, message)))
            while True:
                try:
                    message = done.get_nowait()
                except queue.Empty:
                    break
                # NOTE: acked after the job's outcome was stored (the handler said so).
                message.ack()
                outstanding -= 1


def _acker(done: queue.SimpleQueue[Message], message: Message) -> Callable[[], None]:
    acked = False

    def ack() -> None:
        nonlocal acked
        if not acked:
            acked = True
            done.put(message)

    return ack


def _handle(handle: Callable[[Delivery], None], delivery: Delivery) -> None:
    try:
        handle(delivery)
    except Exception:
        # the job stays in the database; the control plane's reconciler re-dispatches it
        log.exception("could not start job %s", delivery.job_id)
        delivery.ack()

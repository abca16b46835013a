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
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kombu import Connection, Exchange, Message, Queue
from kombu.exceptions import ChannelError, OperationalError

from worker.protocol import BROKER_TRANSPORT_OPTIONS, RUN_JOB_TASK

log = logging.getLogger(__name__)
# Backoff between attempts to re-open a lost broker connection.
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0
# A broker connection that stops answering without closing (a partition, a lost NAT entry, a
# failed-over Redis) gets no RST. kombu's Redis transport waits forever on it by default: a
# synchronous command (an ack, its periodic restore of unacked messages) then hangs the
# consumer for good, while the worker, heartbeating on its own connection, looks idle to the
# reconciler and is never replaced. So every command times out (the connection is then
# re-opened by `consume`), and kombu (5.7+) drops a BRPOP whose answer is overdue by
# BROKER_HEALTH_CHECK_S (its server-side timeout is 1 s), instead of after 25 s; a BRPOP
# whose answer has arrived is never dropped, so a slow worker loses no wake-up to it.
BROKER_SOCKET_TIMEOUT_S = 3.0
BROKER_HEALTH_CHECK_S = 2
CONSUMER_TRANSPORT_OPTIONS = {
    **BROKER_TRANSPORT_OPTIONS,
    "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
    "socket_connect_timeout": BROKER_SOCKET_TIMEOUT_S,
    "health_check_interval": BROKER_HEALTH_CHECK_S,
}


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


def preload() -> None:
    """Import kombu's Redis transport (~0.08 s, paid by the first connection otherwise), so a
    warm-pool worker does not pay it between its load and its first job."""
    import kombu.transport.redis  # noqa: F401


def queue_depth(conn: Connection, queue_name: str) -> int:
    """Messages waiting in a broker queue, every priority (0 when it does not exist yet)."""
    try:
        declared = conn.default_channel.queue_declare(queue=queue_name, passive=True)
    except ChannelError:
        return 0
    return int(declared.message_count)


def jobs_waiting(broker_url: str, queue_name: str) -> bool:
    """Whether wake-ups wait in `queue_name`; False when the broker cannot say."""
    # no reconnect attempts: a broker that is down answers at once (kombu would retry ~6 s)
    options = {**CONSUMER_TRANSPORT_OPTIONS, "max_retries": 0}
    try:
        with Connection(broker_url, transport_options=options) as conn:
            return queue_depth(conn, queue_name) > 0
    except Exception as exc:  # a hint only: the caller does the safe thing without it
        log.warning("queue %s unreadable: %s", queue_name, exc)
        return False


@dataclass(frozen=True, slots=True)
class Delivery:
    """One job handed to the worker; ``ack()`` exactly once when its outcome is stored."""

    # the job to claim
    job_id: str
    # broker priority of the wake-up (lower first)
    priority: int
    # thread-safe: queues the acknowledgement for the consumer's thread
    ack: Callable[[], None]


@dataclass
class _Held:
    """What the worker holds across broker connections."""

    received: deque[Message] = field(default_factory=deque)  # delivered, not yet handed out
    done: queue.SimpleQueue[Message] = field(default_factory=queue.SimpleQueue)  # to ack
    outstanding: int = 0  # handed out, not yet acknowledged
    stopping: bool = False


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

    A lost broker connection (Redis restarting) is re-opened with backoff; the jobs in flight
    go on meanwhile. An ack that cannot reach the broker is dropped: the database holds the
    job's outcome, and the control plane forgets wake-ups nothing needs (`jobs.forget_stale_
    wakeups`), so a restart of the broker never stops a warm worker.
    """
    broker_queue = Queue(queue_name, Exchange(queue_name, "direct"), routing_key=queue_name)
    held = _Held()
    probe = Connection(broker_url)  # not connected: only its transport's error types
    lost = (*probe.connection_errors, *probe.channel_errors, OperationalError, OSError)
    delay = RECONNECT_MIN_S
    while True:
        try:
            with (
                Connection(broker_url, transport_options=CONSUMER_TRANSPORT_OPTIONS) as conn,
                conn.Consumer(
                    [broker_queue],
                    callbacks=[lambda _body, message: held.received.append(message)],
                    prefetch_count=prefetch,
                    accept=["json"],
                ) as consumer,
            ):
                delay = RECONNECT_MIN_S
                if _serve(conn, consumer, held, queue_name, prefetch, handle, should_stop, poll_s):
                    return
        except lost as exc:
            _ack_done(held)  # acks of jobs that finished meanwhile: tried, else dropped
            if held.stopping and held.outstanding == 0:
                return
            log.warning(
                "broker connection lost on %s (%s); reconnecting in %.1f s",
                queue_name,
                type(exc).__name__,
                delay,
            )
            time.sleep(delay)
            delay = min(RECONNECT_MAX_S, delay * 2)


def _serve(
    conn: Connection,
    consumer: Any,
    held: _Held,
    queue_name: str,
    prefetch: int,
    handle: Callable[[Delivery], None],
    should_stop: Callable[[], bool],
    poll_s: float,
) -> bool:
    """One connection's loop; True once stopped and drained."""
    if held.stopping:
        with contextlib.suppress(Exception):
            consumer.cancel()  # reconnected while draining: still no new deliveries
    while True:
        if not held.stopping and should_stop():
            held.stopping = True
            with contextlib.suppress(Exception):
                consumer.cancel()  # no new deliveries
        if held.stopping and held.outstanding == 0 and not held.received:
            return True
        if held.stopping or held.outstanding >= prefetch:
            # Nothing to take (stopping, or every slot held): wait for a finished job. With
            # its slots full kombu sends no BRPOP, and `drain_events` only sleeps out its
            # timeout, so a slot freed meanwhile stayed empty until then: that capped a
            # worker at `prefetch` jobs per `poll_s` (80 short jobs/s at 8 slots). Nothing
            # needs the drain meanwhile: a connection that died is found by the next ack (it
            # raises, and `consume` reconnects), and the unacked wake-ups of dead workers are
            # the control plane's to forget (`forget_stale_wakeups`).
            with contextlib.suppress(queue.Empty):
                held.done.put(held.done.get(timeout=poll_s))
        else:
            with contextlib.suppress(TimeoutError, socket.timeout):
                conn.drain_events(timeout=poll_s)
        while held.received:
            message = held.received.popleft()
            job_id = job_id_of(message.decode(), message.headers or {})
            if held.stopping:
                message.requeue()  # not ours to start any more: back for another worker
            elif job_id is None:
                log.warning("dropping unknown message on %s", queue_name)
                message.ack()
            else:
                held.outstanding += 1
                priority = priority_of(message.properties or {})
                _handle(handle, Delivery(job_id, priority, _acker(held.done, message)))
        _ack_done(held, strict=True)


def _ack_done(held: _Held, strict: bool = False) -> None:
    """Ack every finished job's message (after its outcome was stored: the handler said so).
    `strict`: a broker error propagates (the connection is re-opened); else it is dropped."""
    while True:
        try:
            message = held.done.get_nowait()
        except queue.Empty:
            return
        held.outstanding -= 1
        try:
            message.ack()
        except Exception:
            if strict:
                held.done.put(message)  # acked on the next connection, or dropped then
                held.outstanding += 1
                raise
            log.info("ack of a finished job dropped (broker connection lost)")


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

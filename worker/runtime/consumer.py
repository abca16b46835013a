"""Queue consumer: a deployment queue's wake-ups, acknowledged late.

A wake-up is a Celery protocol-v2 task message for RUN_JOB_TASK in kombu's Redis envelope (the
control plane writes it: `services/jobs/dispatch.wakeup`). The worker reads it the way kombu's Redis
transport does, on two connections of its own: a BRPOP over the queue's priority lists (the
first non-empty list, highest priority, is served first), then the message noted as delivered
and not acknowledged (`unacked` / `unacked_index`, kombu's bookkeeping, which the control plane
sweeps: `reconcile.jobs.forget_stale_wakeups`), and the note removed once the job's outcome is
stored. It held kombu's own consumer until it was measured: kombu spent ~0.6 ms of Python per
job on this thread (a client object built for every command, its message objects), and noted
the delivery (a round trip) before handing the job on. Here the note is sent, the job handed to
its claim, and only then is the note's answer read: the round trip overlaps the claim.

Beside the queue, the worker's own list of jobs handed to it at admission (claimed for it
already: `control_plane/services/jobs/handoff.py`) comes first in the same BRPOP; such a job needs
no claim and no note, and is taken even with every slot held or while draining.

The worker does not run a Celery worker: it needs its own lifecycle (load before consuming,
drain on SIGTERM) and many jobs in flight inside one engine. Prefetch = jobs the worker may
hold; a job is acknowledged only after its result is stored. At-least-once does not rest on
the note: the database is the truth, and the reconciler re-sends the wake-ups of jobs that
wait while their queue is empty and requeues the jobs of dead workers (DESIGN §5).

Not thread-safe: jobs finish on other threads, so a ``Delivery``'s ``ack()`` only queues the
tag; this thread removes the notes on its next turn.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from common.messages import Claim
from common.protocol import job_of_message
from worker.runtime.broker import Broker, connection_pool

log = logging.getLogger(__name__)
# Backoff between attempts to re-open a lost broker connection.
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0
# What a lost broker connection raises.
LOST = (redis.ConnectionError, redis.TimeoutError, OSError)


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
    # a job handed to this worker at admission: its claim's answer (it needs no claim)
    claim: Claim | None = None


@dataclass
class _Held:
    """What the worker holds across broker connections."""

    done: queue.SimpleQueue[str | None]  # tags of finished jobs, to acknowledge (None: none)
    tags: list[str]  # acknowledged jobs whose notes are still to remove
    outstanding: int = 0  # handed out, not yet acknowledged
    stopping: bool = False


def consume(
    broker_url: str,
    queue_name: str,
    prefetch: int,
    handle: Callable[[Delivery], None],
    should_stop: Callable[[], bool],
    poll_s: float = 0.1,
    handoffs: str | None = None,
) -> None:
    """Hand deliveries to ``handle`` until ``should_stop()``, then drain.

    ``handle`` returns at once (the job runs elsewhere) and calls ``delivery.ack()`` later,
    from any thread. At most ``prefetch`` deliveries are unacknowledged at a time. Once
    ``should_stop()`` is true no new work is taken (a message that arrives is put back at the
    head of its list, for another worker) and this returns when every delivery handed out has
    been acknowledged. ``should_stop`` and the acks are looked at every ``poll_s``.

    ``handoffs``: the worker's list of jobs handed to it at admission (`worker_handoffs_key`),
    popped before the queue's wake-ups, and also while every slot is held or while it drains
    (each turn, without blocking): they are its own already, committed as running on it.

    A lost broker connection (Redis restarting) is re-opened with backoff; the jobs in flight
    go on meanwhile. An ack that cannot reach the broker is kept for the next connection, and
    dropped if the worker stops first: the database holds the job's outcome, and the control
    plane forgets wake-ups nothing needs, so a restart of the broker never stops a warm worker.
    """
    held = _Held(queue.SimpleQueue(), [])
    pool = connection_pool(broker_url)
    delay = RECONNECT_MIN_S
    try:
        while True:
            broker: Broker | None = None
            try:
                broker = Broker(pool, queue_name, handoffs)
                delay = RECONNECT_MIN_S
                if _serve(broker, held, prefetch, handle, should_stop, poll_s):
                    return
            except LOST as exc:
                _count_done(held)  # their notes are removed on the next connection
                held.stopping = held.stopping or should_stop()
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
            finally:
                if broker is not None:
                    broker.close()
    finally:
        pool.disconnect()


def _serve(
    broker: Broker,
    held: _Held,
    prefetch: int,
    handle: Callable[[Delivery], None],
    should_stop: Callable[[], bool],
    poll_s: float,
) -> bool:
    """One connection's loop; True once stopped and drained."""
    while True:
        _ack_done(broker, held)
        if not held.stopping and should_stop():
            held.stopping = True  # no new deliveries
        if broker.brpop_sent_at is not None:  # a BRPOP is out: its answer first
            got = broker.answer(poll_s)
            if got is not None:
                held.stopping = held.stopping or should_stop()  # asked while it waited
                _deliver(broker, held, got, handle)
            continue
        if held.stopping or held.outstanding >= prefetch:
            # No wake-up to take (stopping, or every slot held), but a job handed to it is
            # its own: looked for every `poll_s` (at each job's end it was a round trip per
            # job of a worker that a backlog keeps full, where a hand-off is rare: one is made
            # only while the database sees a free slot and no job waiting).
            look = held.stopping or broker.handoffs_due(poll_s)
            if look and (got := broker.handed_off()) is not None:
                _deliver(broker, held, got, handle)
                continue
            if held.stopping and held.outstanding == 0:
                return True  # (its hand-off list just read empty)
            # Wait for a finished job, and take the next wake-up as soon as a slot is free,
            # not after the poll.
            with contextlib.suppress(queue.Empty):
                held.done.put(held.done.get(timeout=poll_s))
            continue
        broker.ask()


def _deliver(
    broker: Broker, held: _Held, got: tuple[bytes, bytes], handle: Callable[[Delivery], None]
) -> None:
    key, message = got
    if broker.handoffs is not None and key == broker.handoffs.encode():
        _deliver_handoff(held, message, handle)
        return
    if held.stopping:
        broker.put_back(key, message)  # not ours to start any more
        return
    try:
        payload = json.loads(message)
    except ValueError:
        payload = None
    job_id = job_of_message(payload)
    if job_id is None:
        log.warning("dropping unknown message on %s", key.decode(errors="replace"))
        return
    properties = payload.get("properties") or {}  # a wake-up's: a dict (`job_of_message`)
    tag = str(properties.get("delivery_tag") or uuid.uuid4())
    held.outstanding += 1
    broker.note(tag, payload)
    _handle(handle, Delivery(job_id, priority_of(properties), _acker(held.done, tag)))
    broker.noted()


def _deliver_handoff(held: _Held, message: bytes, handle: Callable[[Delivery], None]) -> None:
    """A job the admission claimed for this worker: started even while it drains (it is
    running on this worker in the database); nothing to note (no wake-up to sweep)."""
    try:
        claim = Claim.from_json(message)
    except ValueError:
        log.warning("dropping an unreadable hand-off")  # its job is requeued, not held
        return
    held.outstanding += 1
    priority = max(0, claim.priority or 0)
    _handle(handle, Delivery(claim.job_id, priority, _acker(held.done, None), claim=claim))


def _count_done(held: _Held) -> None:
    """Free the slots of finished jobs; their tags wait for a connection to remove notes."""
    while True:
        try:
            tag = held.done.get_nowait()
        except queue.Empty:
            return
        held.outstanding -= 1
        if tag is not None:
            held.tags.append(tag)


def _ack_done(broker: Broker, held: _Held) -> None:
    """Remove the notes of every finished job (its outcome is stored: the handler said so)."""
    _count_done(held)
    if held.tags:
        broker.unnote(held.tags)
        held.tags.clear()


def _acker(done: queue.SimpleQueue[str | None], tag: str | None) -> Callable[[], None]:
    acked = False

    def ack() -> None:
        nonlocal acked
        if not acked:
            acked = True
            done.put(tag)

    return ack


def _handle(handle: Callable[[Delivery], None], delivery: Delivery) -> None:
    try:
        handle(delivery)
    except Exception:
        # the job stays in the database; the control plane's reconciler re-dispatches it
        log.exception("could not start job %s", delivery.job_id)
        delivery.ack()

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
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from common.messages import Claim
from common.protocol import UNACKED_INDEX_KEY, UNACKED_KEY, job_of_message, queue_keys

log = logging.getLogger(__name__)
# Backoff between attempts to re-open a lost broker connection.
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0
# A broker connection that stops answering without closing (a partition, a lost NAT entry, a
# failed-over Redis) gets no RST: every command times out (the connections are then re-opened
# by `consume`), and a BRPOP whose answer is overdue by BROKER_HEALTH_CHECK_S past its
# server-side timeout is given up. A BRPOP whose answer has arrived is always read, so a slow
# worker loses no wake-up to it.
BROKER_SOCKET_TIMEOUT_S = 3.0
BROKER_HEALTH_CHECK_S = 2
# The server-side wait of one BRPOP (kombu's): an idle worker sends one a second.
BRPOP_TIMEOUT_S = 1
# What a lost broker connection raises.
LOST = (redis.ConnectionError, redis.TimeoutError, OSError)


def priority_of(properties: dict[str, Any]) -> int:
    """The message's broker priority (0 = served first: sync; then async, batch)."""
    try:
        return max(0, int(properties.get("priority") or 0))
    except (TypeError, ValueError):
        return 0


def _pool(broker_url: str) -> redis.ConnectionPool:
    # no retries inside a command: a lost connection is `consume`'s to re-open, with backoff
    return redis.ConnectionPool.from_url(
        broker_url,
        socket_timeout=BROKER_SOCKET_TIMEOUT_S,
        socket_connect_timeout=BROKER_SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )


def jobs_waiting(broker_url: str, queue_name: str) -> bool:
    """Whether wake-ups wait in `queue_name`; False when the broker cannot say."""
    pool = _pool(broker_url)
    try:
        pipe = redis.Redis(connection_pool=pool).pipeline(transaction=False)
        for key in queue_keys(queue_name):
            pipe.llen(key)
        return sum(int(n) for n in pipe.execute()) > 0
    except Exception as exc:  # a hint only: the caller does the safe thing without it
        log.warning("queue %s unreadable: %s", queue_name, exc)
        return False
    finally:
        pool.disconnect()


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
    pool = _pool(broker_url)
    delay = RECONNECT_MIN_S
    try:
        while True:
            broker: _Broker | None = None
            try:
                broker = _Broker(pool, queue_name, handoffs)
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


class _Broker:
    """The consumer's two connections: one waits in BRPOP, the other notes and acks (and takes
    a hand-off without waiting while no BRPOP is out)."""

    def __init__(
        self, pool: redis.ConnectionPool, queue_name: str, handoffs: str | None = None
    ) -> None:
        # a BRPOP serves the first non-empty list of these: the hand-offs first
        self.keys = ([handoffs] if handoffs else []) + queue_keys(queue_name)
        self.handoffs = handoffs
        self.handoffs_read_at = 0.0  # when `handed_off` last looked (monotonic)
        # redis-py's connections are not typed
        self.waiting: Any = cast(Any, pool.make_connection())
        self.notes: Any = cast(Any, pool.make_connection())
        self.brpop_sent_at: float | None = None
        try:
            for conn in (self.waiting, self.notes):
                conn.connect()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for conn in (self.waiting, self.notes):
            conn.disconnect()

    def ask(self) -> None:
        """Send a BRPOP; its answer is read by `answer`."""
        self.waiting.send_command("BRPOP", *self.keys, BRPOP_TIMEOUT_S)
        self.brpop_sent_at = time.monotonic()

    def answer(self, wait_s: float) -> tuple[bytes, bytes] | None:
        """The BRPOP's (list, message) once it came within `wait_s`, else None (also when the
        server's wait ran out: `brpop_sent_at` says which). Raises when it is overdue."""
        assert self.brpop_sent_at is not None
        if not self.waiting.can_read(timeout=wait_s):
            if time.monotonic() - self.brpop_sent_at > BRPOP_TIMEOUT_S + BROKER_HEALTH_CHECK_S:
                raise redis.TimeoutError("the broker's BRPOP answer is overdue")
            return None
        self.brpop_sent_at = None
        reply = self.waiting.read_response()
        if not reply:
            return None
        key, message = reply
        return key, message

    def note(self, tag: str, payload: dict[str, Any]) -> None:
        """Send the delivery's note (kombu's: `[payload, exchange, routing key]` by tag, and
        when); its answer is read by `noted`."""
        info = (payload.get("properties") or {}).get("delivery_info") or {}
        raw = json.dumps([payload, info.get("exchange", ""), info.get("routing_key", "")])
        commands = [
            ("MULTI",),
            ("ZADD", UNACKED_INDEX_KEY, time.time(), tag),
            ("HSET", UNACKED_KEY, tag, raw),
            ("EXEC",),
        ]
        self.notes.send_packed_command(self.notes.pack_commands(commands))

    def noted(self) -> None:
        if (failed := _replies(self.notes, 4)) is not None:
            log.warning("a delivery was not noted (%s); its job runs on", failed)

    def unnote(self, tags: list[str]) -> None:
        """Remove the notes of acknowledged deliveries, in one transaction."""
        commands = [
            ("MULTI",),
            ("ZREM", UNACKED_INDEX_KEY, *tags),
            ("HDEL", UNACKED_KEY, *tags),
            ("EXEC",),
        ]
        self.notes.send_packed_command(self.notes.pack_commands(commands))
        if (failed := _replies(self.notes, 4)) is not None:
            # left for the control plane's sweep of wake-ups nothing needs
            log.warning("the notes of %d acked deliveries stay (%s)", len(tags), failed)

    def handoffs_due(self, every_s: float) -> bool:
        """Whether the hand-off list was last looked at `every_s` ago or more."""
        return time.monotonic() - self.handoffs_read_at >= every_s

    def handed_off(self) -> tuple[bytes, bytes] | None:
        """The next job handed to this worker, without waiting; None when there is none."""
        if self.handoffs is None:
            return None
        self.handoffs_read_at = time.monotonic()
        self.notes.send_command("RPOP", self.handoffs)
        message = self.notes.read_response()
        return None if message is None else (self.handoffs.encode(), message)

    def put_back(self, key: bytes, message: bytes) -> None:
        """At the head of its list (BRPOP takes from the right): served next, by another."""
        self.notes.send_command("RPUSH", key, message)
        if (failed := _replies(self.notes, 1)) is not None:
            # its job waits in the database; the reconciler re-sends its wake-up
            log.warning("a wake-up could not be put back (%s)", failed)


def _replies(conn: Any, n: int) -> Exception | None:
    """Read `n` replies (an error reply is read whole, so the connection stays in step); the
    last error among them (an EXEC's own included), or None."""
    failed: Exception | None = None
    for _ in range(n):
        try:
            reply = conn.read_response()
        except redis.ResponseError as exc:  # the server refused (out of memory, say)
            failed = exc
            continue
        if isinstance(reply, list):
            failed = next((r for r in reply if isinstance(r, Exception)), failed)
    return failed


def _serve(
    broker: _Broker,
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
    broker: _Broker, held: _Held, got: tuple[bytes, bytes], handle: Callable[[Delivery], None]
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


def _ack_done(broker: _Broker, held: _Held) -> None:
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

"""The worker's connections to the broker (Redis): a pool without retries inside a command
(`consume` re-opens a lost connection, with backoff), and `Broker`, the consumer's two
connections: one waits in BRPOP over the hand-off list and the queue's priority lists, the other
notes deliveries, acknowledges them and takes a hand-off without waiting.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from common.protocol import UNACKED_INDEX_KEY, UNACKED_KEY, queue_keys

log = logging.getLogger(__name__)
# A broker connection that stops answering without closing (a partition, a lost NAT entry, a
# failed-over Redis) gets no RST: every command times out (the connections are then re-opened
# by `consume`), and a BRPOP whose answer is overdue by BROKER_HEALTH_CHECK_S past its
# server-side timeout is given up. A BRPOP whose answer has arrived is always read, so a slow
# worker loses no wake-up to it.
BROKER_SOCKET_TIMEOUT_S = 3.0
BROKER_HEALTH_CHECK_S = 2
# The server-side wait of one BRPOP (kombu's): an idle worker sends one a second.
BRPOP_TIMEOUT_S = 1


def connection_pool(broker_url: str) -> redis.ConnectionPool:
    # no retries inside a command: a lost connection is `consume`'s to re-open, with backoff
    return redis.ConnectionPool.from_url(
        broker_url,
        socket_timeout=BROKER_SOCKET_TIMEOUT_S,
        socket_connect_timeout=BROKER_SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )


def jobs_waiting(broker_url: str, queue_name: str) -> bool:
    """Whether wake-ups wait in `queue_name`; False when the broker cannot say."""
    pool = connection_pool(broker_url)
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


class Broker:
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

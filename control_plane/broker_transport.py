"""kombu's Redis transport with one change, so that a broker restart does not stop the Celery
worker (`make_celery` selects it for `redis://` brokers; the workers' own consumer reads the
broker with redis-py and does not use it).

Celery (5.5 and later) handles a lost broker connection by collecting the connection, which
detaches its transport (`transport.client = None`), and then closing it. Closing the channel
gives back the messages it holds unacknowledged (a webhook retry waiting for its countdown, a
task running: `acks_late`), which needs a new connection pool, whose parameters kombu reads
from that detached transport: `AttributeError: 'NoneType' object has no attribute 'hostname'`.
Celery expects only connection errors there, so the worker exited ("Unrecoverable error") on
every Redis restart, for its supervisor to start again.

Here that read fails as what it is, a connection error: Celery ignores it while closing and
reconnects, in the same process. The messages stay in kombu's unacked hash, as they would have
anyway (the broker they would be given back to is the one that just went away); the
reconciler's sweeps forget them and re-send the webhook chains they carried
(docs/reliability.md), as after a Celery worker's death.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection was closed (a broker restart)")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel

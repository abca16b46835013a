"""Which replica's reconciler acts: a lease in Redis (or a Kubernetes Lease: lease_kubernetes.py)
won, renewed every tick, and turned into a fencing token in the database (reconcile/fence.py).

Every control-plane replica runs a reconciler process; each loop it calls `Leadership.poll`.
The one that holds the lease gets its token and ticks; the others wait. A leader that is
SIGKILLed stops renewing and another replica takes over once the lease runs out
(`reconciler_lease_s`); one that stops cleanly releases it, and the next takes over at once.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from control_plane.domain.clock import Clock
from control_plane.domain.lease import believes_it_leads
from control_plane.reconcile import fence

log = logging.getLogger(__name__)


class LeaseUnreachable(Exception):
    """The lease's store did not answer: nobody can win or renew the lease just now."""


class Lease(Protocol):
    def hold(self) -> bool:
        """Win or renew the lease for this replica: True while it is ours (raises
        LeaseUnreachable when the store cannot say)."""

    def release(self) -> None:
        """Give the lease up if it is ours (a clean stop: the next replica needs no wait)."""


def replica_name(configured: str) -> str:
    """This replica's name in the lease: the configured one (the pod name under Kubernetes)
    or host:pid, unique among the processes that can run at once."""
    return configured or f"{socket.gethostname()}:{os.getpid()}"


class Leadership:
    """Whether this replica leads now, and with which fencing token."""

    def __init__(
        self,
        lease: Lease,
        sessions: sessionmaker[Session],
        holder: str,
        lease_s: float,
        on_step_down: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = lease
        self._on_step_down = on_step_down
        self.sessions = sessions
        self.holder = holder
        self.lease_s = lease_s
        self._monotonic = monotonic
        self._renewed: float | None = None  # monotonic time of the last renewal seen to work
        self.token: int | None = None  # while leading

    def poll(self, clock: Clock) -> int | None:
        """Renew or win the lease; the token while this replica leads, None while it follows."""
        asked = self._monotonic()
        try:
            held = self.lease.hold()
        except LeaseUnreachable as exc:
            # Keep acting while the lease we last renewed is surely still ours: a short outage
            # of the store must not stop the platform; a longer one makes us step down.
            if self.token is not None and not believes_it_leads(
                self._renewed, self.lease_s, self._monotonic()
            ):
                self._step_down(f"lease store unreachable: {exc}")
            return self.token
        if not held:
            if self.token is not None:
                self._step_down("another replica holds the lease")
            return None
        self._renewed = asked  # the renewal counts from before it was sent
        if self.token is None:
            self.token = fence.take(self.sessions, self.holder, clock())
            log.info(
                "leading as %s with fencing token %d",
                self.holder,
                self.token,
                extra={"reason": "lease_won"},
            )
        return self.token

    def deposed(self) -> None:
        """A transaction found a newer token: another replica leads, whatever the lease said."""
        self._step_down("a newer fencing token exists")

    def release(self) -> None:
        if self.token is not None:
            self.lease.release()
            self.token = None

    def _step_down(self, why: str) -> None:
        log.warning("stopped leading: %s", why, extra={"reason": "lease_lost"})
        self.token = None
        self._renewed = None
        self._on_step_down()

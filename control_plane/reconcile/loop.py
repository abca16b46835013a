"""The reconciler process's loop: poll the lease, tick while leading, wait, repeat."""

from __future__ import annotations

import logging
import threading
import time

from control_plane.domain.clock import Clock
from control_plane.reconcile import fence
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.lease import Leadership
from control_plane.services.scaling import arrivals

log = logging.getLogger("control_plane.reconcile")


def run(
    reconciler: Reconciler, leadership: Leadership, clock: Clock, stop: threading.Event
) -> None:
    """Until `stop` is set; then stop every worker this replica runs and give the lease up."""
    settings = reconciler.env.settings
    r = reconciler.env.redis
    while not stop.is_set():
        ticked = time.monotonic()
        try:
            token = leadership.poll(clock)
        except Exception:  # the database could not hand out a token: try again next time
            log.exception("could not take the lease's fencing token")
            token = None
        if token is None:
            # Followers only wait: a nudge popped here would be lost to the leader.
            stop.wait(settings.autoscaler_interval_s)
            continue
        try:
            reconciler.tick(clock(), token)
        except fence.Deposed:
            leadership.deposed()
            continue
        except Exception:
            log.exception("reconciler tick failed")
        # the next tick: after the interval, or at once when a call found a deployment at zero
        arrivals.wait_for_work(r, settings.autoscaler_interval_s, ticked)
    _stop(reconciler, leadership, clock)


def _stop(reconciler: Reconciler, leadership: Leadership, clock: Clock) -> None:
    exited = reconciler.stop()
    token = leadership.token
    if token is None:  # a follower: the leader records what ended
        return
    try:
        reconciler.record_stopped(exited, clock(), token)
    except fence.Deposed:
        log.warning("stopped as a deposed leader: the new leader records its workers")
    leadership.release()

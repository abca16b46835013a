"""`python -m control_plane.reconcile`: the reconciler process, one per control-plane replica.
The one holding the lease (reconcile/lease.py) ticks every autoscaler_interval_s and starts and
stops workers through its provider (local processes, or pods); the others wait for the lease.
Every replica refits the autoscaler's models every autoscaler_refit_interval_s on a background
thread, so a new leader starts with them."""

from __future__ import annotations

import logging
import os
import threading

import redis

from common import logs, tracing
from common.signals import on_signals
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.clock import utc_now
from control_plane.metrics import server
from control_plane.providers.select import make_provider, workers_env
from control_plane.reconcile import loop
from control_plane.reconcile.driver import Reconciler, tune_gc
from control_plane.reconcile.env import Env
from control_plane.reconcile.lease import Leadership, Lease, replica_name
from control_plane.reconcile.lease_redis import RedisLease
from control_plane.services.jobs.dispatch import make_celery
from control_plane.settings import Settings

log = logging.getLogger("control_plane.reconcile")


def main() -> None:
    settings = Settings()
    logs.configure("reconciler", settings)
    tracing.configure("reconciler", settings)  # ticks that act, and requeues in jobs' traces
    # before anything another process can see is up (its /metrics port): a stop asked during
    # start-up ends it cleanly once started, never by the signal's default action
    stop = threading.Event()
    on_signals(lambda _signum: stop.set())  # off the main thread: common/signals.py
    # its own /metrics when its pod or container is not the API's (metrics/server.py)
    metrics = server.serve_from(settings)
    provider = make_provider(settings, workers_env(settings, os.environ))
    reconciler = Reconciler(
        Env(settings, redis.Redis.from_url(settings.redis_url), make_celery(settings), provider),
        # a paused leader's open transaction holds the fence row (reconcile/fence.py): the
        # database ends it once the lease it relied on has run out
        make_sessionmaker(
            make_engine(settings.database_url, idle_transaction_s=settings.reconciler_lease_s)
        ),
    )
    reconciler.start(utc_now)  # the autoscaler's model refits, on their own thread
    tune_gc()
    holder = replica_name(settings.replica_id)
    leadership = Leadership(
        make_lease(settings, reconciler.env.redis, holder),
        reconciler.sessions,
        holder,
        settings.reconciler_lease_s,
        on_step_down=provider.step_down,
    )
    log.info("reconciler %s running every %.2fs", holder, settings.autoscaler_interval_s)
    loop.run(reconciler, leadership, utc_now, stop)
    if metrics is not None:
        metrics.close()
    log.info("reconciler stopped")


def make_lease(settings: Settings, r: redis.Redis, holder: str) -> Lease:
    """A Kubernetes Lease under the kubernetes provider (its RBAC grants leases), else Redis."""
    if settings.provider == "kubernetes":
        # imported only then: the kubernetes client is an optional dependency
        from control_plane.reconcile.lease_kubernetes import KubernetesLease

        return KubernetesLease.from_settings(settings, holder)
    return RedisLease(r, holder, settings.reconciler_lease_s)


if __name__ == "__main__":
    main()

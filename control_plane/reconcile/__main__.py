"""`python -m control_plane.reconcile`: the reconciler process of the embedded platform. It
owns the local worker processes (the local provider), ticks every autoscaler_interval_s and
refits the autoscaler's models every autoscaler_refit_interval_s on a background thread."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import redis

from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.clock import utc_now
from control_plane.providers.local import LocalProvider, worker_env
from control_plane.reconcile.driver import Reconciler, tune_gc
from control_plane.reconcile.env import Env
from control_plane.services import arrivals
from control_plane.services.dispatch import make_celery
from control_plane.settings import Settings
from worker import logs

log = logging.getLogger("control_plane.reconcile")


def main() -> None:
    settings = Settings()
    logs.configure("reconciler", settings)
    env = worker_env(
        os.environ,
        {
            "PLATFORM_INTERNAL_URL": settings.internal_url,
            "PLATFORM_WORKER_TOKEN": settings.worker_token.get_secret_value(),
            "PLATFORM_REDIS_URL": settings.redis_url,
            "PLATFORM_WORKER_THREADS": str(settings.worker_threads),
        },
    )
    env.setdefault("AWS_DEFAULT_REGION", settings.s3_region)
    provider = LocalProvider(env, settings.state_dir / "logs" / "workers", settings.worker_python)
    reconciler = Reconciler(
        Env(settings, redis.Redis.from_url(settings.redis_url), make_celery(settings), provider),
        make_sessionmaker(make_engine(settings.database_url)),
    )
    reconciler.start(utc_now)  # the autoscaler's model refits, on their own thread
    tune_gc()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("reconciler running every %.2fs", settings.autoscaler_interval_s)
    r = reconciler.env.redis
    while not stop.is_set():
        ticked = time.monotonic()
        try:
            reconciler.tick(utc_now())
        except Exception:
            log.exception("reconciler tick failed")
        # the next tick: after the interval, or at once when a call found a deployment at zero
        arrivals.wait_for_work(r, settings.autoscaler_interval_s, ticked)
    reconciler.shutdown(utc_now())
    log.info("reconciler stopped")


if __name__ == "__main__":
    main()

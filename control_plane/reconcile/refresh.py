"""The autoscaler's slow half in the reconciler process: a background thread that keeps, per
live deployment, what changes slowly — the measured boot and service times and the models
refit on the arrival history (`domain.scaling.refit`) — so the tick only reads a snapshot and
never fits (DESIGN §8: decide() on the hot path, models off it).

Every `autoscaler_refit_interval_s` per deployment (and at once after a new version) the refresher
reads the deployment's arrival history (Redis, `services/scaling/arrivals.py`), the boot times of
the version's recent workers and the recent execution times (SQL), and refits. A failure keeps the
previous snapshot; models older than `MAX_MODEL_AGE_S` are ignored by decide(), so a dead refresher
degrades to the reactive autoscaler, never to a wrong one.

    refresher = ModelRefresher(env, sessions)
    refresher.start(utc_now)             # the reconciler process; tests call refresh(now)
    refresher.latest(deployment_id)      # Measured | None, read by the tick
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from control_plane.db.models import Deployment
from control_plane.domain.clock import Clock
from control_plane.domain.cold_start import PhaseTimes
from control_plane.domain.scaling.models import Models, refit
from control_plane.domain.scaling.policy import DEFAULT_BOOT_S, DEFAULT_SERVICE_S
from control_plane.domain.scaling.service import mean_service_s
from control_plane.reconcile.env import Env
from control_plane.services import deployments
from control_plane.services.jobs import job_queries
from control_plane.services.scaling import arrivals
from control_plane.services.workers import boot_history

log = logging.getLogger(__name__)
# The thread looks for deployments due a refit this often (seconds).
POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class Measured:
    """A deployment's slowly changing inputs to decide(), as of `at`."""

    at: datetime  # when they were measured
    version: int  # the deployment version boot_s was measured for
    boot_s: float  # median start → ready of the version's recent workers (a prior when none)
    service_s: float  # mean execution seconds of recent jobs (`scaling.service`; a prior when none)
    models: Models  # forecast and idle windows fitted on the arrival history at `at`
    # median boot, load and warm seconds of the version's recent workers (cold-start ETAs)
    phase_times: PhaseTimes = field(default_factory=PhaseTimes)


class ModelRefresher:
    """Refits each live deployment's models every `interval_s`; thread-safe to read."""

    def __init__(self, env: Env, sessions: sessionmaker[Session]) -> None:
        self.env = env
        self.sessions = sessions
        self.interval_s = env.settings.autoscaler_refit_interval_s
        # NOTE: replaced whole, never mutated: the tick reads it from another thread.
        self._latest: dict[str, Measured] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self, deployment_id: str) -> Measured | None:
        return self._latest.get(deployment_id)

    def refresh(self, now: datetime) -> int:
        """Refit the deployments that are due at `now`; returns how many were refit."""
        with self.sessions() as session:
            live = deployments.list_live(session)
            latest = {d.id: m for d in live if (m := self._latest.get(d.id)) is not None}
            refit_count = 0
            for dep in live:
                last = latest.get(dep.id)
                if (
                    last is not None
                    and last.version == dep.version
                    and (now - last.at).total_seconds() < self.interval_s
                ):
                    continue
                try:
                    latest[dep.id] = measure(session, self.env, dep, now)
                    refit_count += 1
                except Exception:
                    session.rollback()
                    log.exception("refit of deployment %s failed; keeping the last", dep.id)
        self._latest = latest  # deleted deployments are dropped here
        return refit_count

    def start(self, clock: Clock) -> None:
        """Run `refresh` on a daemon thread until `stop`."""
        assert self._thread is None, "started twice"
        self._thread = threading.Thread(
            target=self._run, args=(clock,), name="scaling-models", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self, clock: Clock) -> None:
        while not self._stop.is_set():
            try:
                self.refresh(clock())
            except Exception:
                log.exception("scaling model refresh failed")
            self._stop.wait(min(POLL_S, self.interval_s))


def measure(session: Session, env: Env, dep: Deployment, now: datetime) -> Measured:
    """Boot and service times from SQL, arrivals from Redis, and the models fitted on them."""
    policy = dep.spec.scaling_policy()
    boot_s = boot_history.recent_boot_s(session, dep.id, dep.version)
    service_s = mean_service_s(job_queries.recent_executions(session, dep.id, now), now.timestamp())
    boot_s = DEFAULT_BOOT_S if boot_s is None else boot_s
    service_s = DEFAULT_SERVICE_S if service_s is None else service_s
    models = refit(arrivals.read(env.redis, dep.id, now), policy, boot_s, service_s)
    phases = boot_history.recent_phase_s(session, dep.id, dep.version)
    return Measured(
        at=now,
        version=dep.version,
        boot_s=boot_s,
        service_s=service_s,
        models=models,
        phase_times=PhaseTimes(phases.get("boot"), phases.get("load"), phases.get("warm")),
    )

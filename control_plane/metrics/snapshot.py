"""The state families: derived at scrape time from SQL and Redis, where their truth lives.

    read       I/O: one snapshot (live deployments, active jobs, live workers, the latest
               scaling decisions, decision counts, the billing check)
    families   pure: a snapshot → Prometheus metric families
    Fleet      the custom collector one scrape registers: `read` then `families`

Only the process answering a scrape reads the snapshot (it is never written to the
multiprocess files), so each gauge appears once per scrape however many API processes run.
Several control-plane replicas each answer with the same numbers: aggregate them with max().
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from common.protocol import WorkerState
from control_plane.db.models import Deployment, Job
from control_plane.domain.states import ACTIVE
from control_plane.services.scaling import scale_decisions
from control_plane.services.workers import billing, worker_records

log = logging.getLogger(__name__)

# Zero-filled, so a series does not vanish when its count drops to nothing.
ACTIVE_STATUSES = tuple(s.value for s in sorted(ACTIVE))
WORKER_STATES = tuple(
    s.value
    for s in (
        WorkerState.BOOTING,
        WorkerState.LOADING,
        WorkerState.WARMING,
        WorkerState.IDLE,
        WorkerState.BUSY,
        WorkerState.DRAINING,
    )
)


@dataclass(frozen=True, slots=True)
class Named:
    name: str  # the deployment's name (unique per tenant only)
    tenant_id: str  # its tenant


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The platform's state at one scrape."""

    # deployment id → its name: the live ones, and deleted ones that still have active jobs
    deployments: dict[str, Named]
    # ids of the deployments not deleted
    live: frozenset[str]
    # (deployment id, status) → jobs in that active status (queued, starting, running)
    active_jobs: dict[tuple[str, str], int]
    # (state, accelerator, pool engine) → live or draining workers; pool engine: the engine
    # of a warm-pool worker (unassigned), None for a deployment's worker
    workers: dict[tuple[str, str, str | None], int]
    # deployment id → (desired, actual) workers of its latest scaling decision (recent ones)
    scaling: dict[str, tuple[int, int]]
    # decision reason → decisions taken with it (None: Redis unreadable)
    decisions: dict[str, int] | None
    # inconsistencies the billing check finds across all tenants
    billing_issues: int


def read(session: Session, r: redis.Redis, now: datetime) -> Snapshot:
    """The snapshot (a handful of queries, one MGET, one HGETALL and the billing check)."""
    active: dict[tuple[str, str], int] = {
        (dep_id, status): n
        for dep_id, status, n in session.execute(
            select(Job.deployment_id, Job.status, func.count())
            .where(Job.status.in_(ACTIVE_STATUSES))
            .group_by(Job.deployment_id, Job.status)
        )
    }
    with_jobs = {dep_id for dep_id, _ in active}
    rows = session.execute(
        select(Deployment.id, Deployment.name, Deployment.tenant_id, Deployment.deleted_at).where(
            Deployment.deleted_at.is_(None) | Deployment.id.in_(with_jobs)
        )
    ).all()
    live = frozenset(row.id for row in rows if row.deleted_at is None)
    fleet: dict[tuple[str, str, str | None], int] = {}
    for w in worker_records.live(session):
        key = (w.state, w.accelerator, w.engine if w.deployment_id is None else None)
        fleet[key] = fleet.get(key, 0) + 1
    scaling = {
        dep_id: (doc["desired"], doc["actual"])
        for dep_id, doc in scale_decisions.latest(r, sorted(live)).items()
        if isinstance(doc.get("desired"), int) and isinstance(doc.get("actual"), int)
    }
    try:
        decisions: dict[str, int] | None = scale_decisions.counts(r)
    except redis.RedisError as exc:
        log.warning("metrics: decision counts unreadable (Redis: %s)", exc)
        decisions = None  # the other numbers still come
    return Snapshot(
        deployments={row.id: Named(row.name, row.tenant_id) for row in rows},
        live=live,
        active_jobs=active,
        workers=fleet,
        scaling=scaling,
        decisions=decisions,
        billing_issues=len(billing.check(session, None, now)),
    )


def families(s: Snapshot) -> list[Metric]:
    """Pure: the snapshot's metric families."""
    dep = ["deployment", "tenant"]
    jobs = GaugeMetricFamily(
        "platform_jobs_active",
        "Jobs not ended, by status: queued, starting (a worker boots for it), running.",
        labels=[*dep, "status"],
    )
    counts = dict.fromkeys(((d, st) for d in s.live for st in ACTIVE_STATUSES), 0)
    counts.update(s.active_jobs)
    for (dep_id, status), n in sorted(counts.items()):
        named = s.deployments.get(dep_id)
        if named is not None:
            jobs.add_metric([named.name, named.tenant_id, status], n)

    by_state = GaugeMetricFamily(
        "platform_workers", "Live workers by state.", labels=["state", "accelerator"]
    )
    pool = GaugeMetricFamily(
        "platform_warm_pool_workers",
        "Warm-pool workers (no deployment yet) by state: the pool's size, per engine.",
        labels=["state", "accelerator", "engine"],
    )
    accelerators = sorted({a for _, a, _ in s.workers})
    # the built-in engine's pool on every type in use; another engine's once it has workers
    engines = sorted({"builtin"} | {e for _, _, e in s.workers if e is not None})
    for accelerator in accelerators:
        for state in WORKER_STATES:
            total = sum(n for (st, a, _), n in s.workers.items() if (st, a) == (state, accelerator))
            by_state.add_metric([state, accelerator], total)
            if state not in (WorkerState.BOOTING, WorkerState.IDLE, WorkerState.DRAINING):
                continue
            for engine in engines:
                pool.add_metric(
                    [state, accelerator, engine], s.workers.get((state, accelerator, engine), 0)
                )

    desired = GaugeMetricFamily(
        "platform_autoscaler_desired_workers",
        "Workers the autoscaler's latest decision wants (booting ones included).",
        labels=dep,
    )
    actual = GaugeMetricFamily(
        "platform_autoscaler_actual_workers",
        "Workers that counted at the autoscaler's latest decision (ready, or booting in time).",
        labels=dep,
    )
    for dep_id, (want, have) in sorted(s.scaling.items()):
        named = s.deployments.get(dep_id)
        if named is not None:
            desired.add_metric([named.name, named.tenant_id], want)
            actual.add_metric([named.name, named.tenant_id], have)

    out: list[Metric] = [jobs, by_state, pool, desired, actual]
    if s.decisions is not None:
        decisions = CounterMetricFamily(
            "platform_scale_decisions",
            "Autoscaler decisions (one per deployment and tick) by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(s.decisions.items()):
            decisions.add_metric([reason], n)
        out.append(decisions)
    out.append(
        GaugeMetricFamily(
            "platform_billing_drift_issues",
            "Billing inconsistencies found by the check.",
            value=s.billing_issues,
        )
    )
    return out


class Fleet(Collector):
    """The state families of one scrape (`read` runs when the registry collects)."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from families(self._snapshot())

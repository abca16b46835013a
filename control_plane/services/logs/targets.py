"""What `GET /v1/logs` reads for a job, a worker or a deployment of the caller's tenant.

A job: its lines in the logs of the workers that ran its attempts and in the platform's logs.
A worker: its whole log, and the platform's lines about it. A deployment: the logs of its
recent workers, and the platform's lines about it. Another tenant's job, worker or deployment
raises the same NotFound, with the same body, as a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from control_plane.db.models import JobAttempt, Worker
from control_plane.domain.log_lines import Selector, iso
from control_plane.errors import InvalidRequest, NotFound
from control_plane.services import deployments
from control_plane.services.jobs import job_store

# A deployment's workers whose logs a read goes through, newest first: the fleet of a busy
# deployment over the last hours; older workers' logs stay readable one by one (?worker=).
MAX_DEPLOYMENT_WORKERS = 50


@dataclass(frozen=True, slots=True)
class Target:
    selector: Selector  # which lines of the logs below the tenant sees
    worker_ids: tuple[str, ...]  # workers whose own logs are read (the tenant's)
    deployment_id: str | None  # a deployment's: a follow looks for its new workers


def one_of(job: str | None, worker: str | None, deployment: str | None) -> None:
    """InvalidRequest unless exactly one of the three is given."""
    given = [n for n, v in (("job", job), ("worker", worker), ("deployment", deployment)) if v]
    if len(given) != 1:
        raise InvalidRequest(
            "give exactly one of job, worker or deployment "
            f"(got {', '.join(given) if given else 'none'})",
            errors=[{"field": "job|worker|deployment", "message": "exactly one is required"}],
        )


def resolve(
    session: Session,
    tenant_id: str,
    *,
    job: str | None,
    worker: str | None,
    deployment: str | None,
    since: datetime | None,
) -> Target:
    one_of(job, worker, deployment)
    at = iso(since) if since is not None else None
    if job:
        row = job_store.get(session, tenant_id, job)
        ran = set(session.scalars(select(JobAttempt.worker_id).where(JobAttempt.job_id == row.id)))
        if row.worker_id:
            ran.add(row.worker_id)
        return Target(Selector(row.id, None, None, at), tuple(sorted(ran)), None)
    if worker:
        w = session.get(Worker, worker)
        if w is None or w.tenant_id != tenant_id:
            raise NotFound(f"worker '{worker}' does not exist", worker_id=worker)
        return Target(Selector(None, None, w.id, at), (w.id,), None)
    assert deployment is not None  # one_of
    dep = deployments.get(session, tenant_id, deployment)
    return Target(Selector(None, dep.id, None, at), workers_of(session, dep.id, since), dep.id)


def workers_of(session: Session, deployment_id: str, since: datetime | None) -> tuple[str, ...]:
    """The deployment's workers whose logs hold lines from `since` on (still running, or
    stopped since), newest first, at most MAX_DEPLOYMENT_WORKERS."""
    q = select(Worker.id).where(Worker.deployment_id == deployment_id)
    if since is not None:
        q = q.where(or_(Worker.stopped_at.is_(None), Worker.stopped_at >= since))
    q = q.order_by(Worker.started_at.desc()).limit(MAX_DEPLOYMENT_WORKERS)
    return tuple(session.scalars(q))


__all__ = ["MAX_DEPLOYMENT_WORKERS", "Target", "one_of", "resolve", "workers_of"]

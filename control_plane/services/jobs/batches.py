"""Batches: many jobs from one JSONL input, dispatched at most `max_in_flight` at a time.

    create   every line already validated → batch + one job per line in ONE transaction; the
             first `max_in_flight` jobs get `dispatched_at` in that same transaction
    pump     the reconciler's tick (`reconcile/batches.py`) tops each running batch up to
             `max_in_flight`, and completes it (`complete`) once every line ended
    cancel   pending jobs → canceled, running ones get a cancel flag, batch → canceled

NOTE: a batch job is "in flight" when it runs, or is pending with `dispatched_at` set; a pending
job with `dispatched_at` None waits for a slot and must get no wake-up from anyone else.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from celery import Celery
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common import tracing
from common.job_input import JobInput
from control_plane.db.models import Batch, Deployment, Job
from control_plane.domain import endings
from control_plane.domain.clock import iso
from control_plane.domain.ids import new_id
from control_plane.domain.states import ACTIVE, JobStatus
from control_plane.errors import Conflict, NotFound
from control_plane.services.jobs import finish
from control_plane.services.jobs.outbox import Outbox
from control_plane.services.paging import tenant_page
from control_plane.services.storage import object_store
from control_plane.services.webhooks import signing
from control_plane.settings import Settings
from control_plane.tasks_api import enqueue_batch_webhook

log = logging.getLogger(__name__)

RUNNING, COMPLETED, CANCELED = "running", "completed", "canceled"
RESULTS_CONTENT_TYPE = "application/jsonl"
# NOTE: a batch's Idempotency-Key is stored on its job at index 0 behind this prefix, so the
# jobs table's UNIQUE(tenant_id, idempotency_key) also settles races between batch creations.
# The unit separator cannot occur in an HTTP header value, so no job key can collide with it.
IDEMPOTENCY_PREFIX = "\x1fbatch:"


def find_replay(
    session: Session, tenant_id: str, idempotency_key: str, request_hash: str
) -> Batch | None:
    """The batch created earlier with this key (409 if with another body), else None."""
    first = session.scalars(
        select(Job).where(
            Job.tenant_id == tenant_id,
            Job.idempotency_key == IDEMPOTENCY_PREFIX + idempotency_key,
        )
    ).first()
    if first is None or first.batch_id is None:
        return None
    if first.request_hash != request_hash:
        raise Conflict(
            "this Idempotency-Key was used with a different request body", batch_id=first.batch_id
        )
    return session.get(Batch, first.batch_id)


def create(
    session: Session,
    dep: Deployment,
    inputs: list[JobInput],
    now: datetime,
    *,
    max_in_flight: int,
    webhook_url: str | None,
    input_uri: str | None,
    idempotency_key: str | None,
    request_hash: str,
    api_key_id: str | None,
) -> tuple[Batch, bool, list[str]]:
    """Insert the batch and its jobs (not committed); returns (batch, created, ids to wake).

    `inputs` are validated and resolved job inputs, in input order (at least one).
    """
    assert inputs, "a batch has at least one line (checked at the edge)"
    if idempotency_key is not None:
        existing = find_replay(session, dep.tenant_id, idempotency_key, request_hash)
        if existing is not None:
            return existing, False, []
    batch = Batch(
        id=new_id("bat", now),
        tenant_id=dep.tenant_id,
        deployment_id=dep.id,
        deployment_name=dep.name,
        status=RUNNING,
        input_uri=input_uri,
        total=len(inputs),
        max_in_flight=max_in_flight,
        webhook_url=webhook_url,
        webhook_status="pending" if webhook_url else "none",
        idempotency_key=idempotency_key,
        created_at=now,
    )
    session.add(batch)
    # the request's span: each line's worker spans join the batch request's trace (None: off)
    traceparent = tracing.current_traceparent()
    rows = [
        Job(
            id=new_id("job", now),
            tenant_id=dep.tenant_id,
            deployment_id=dep.id,
            deployment_name=dep.name,
            deployment_version=dep.version,
            kind="batch",
            status=JobStatus.QUEUED,
            input=job_input.to_dict(),
            webhook_status="none",
            batch_id=batch.id,
            batch_index=i,
            dispatched_at=now if i < max_in_flight else None,
            api_key_id=api_key_id,
            traceparent=traceparent,
            created_at=now,
        )
        for i, job_input in enumerate(inputs)
    ]
    if idempotency_key is not None:
        rows[0].idempotency_key = IDEMPOTENCY_PREFIX + idempotency_key
        rows[0].request_hash = request_hash
    session.add_all(rows)
    try:
        session.flush()
    except IntegrityError:
        # A concurrent request with the same key won the race.
        session.rollback()
        existing = find_replay(session, dep.tenant_id, idempotency_key or "", request_hash)
        if existing is None:
            raise
        return existing, False, []
    return batch, True, [j.id for j in rows[:max_in_flight]]


def get(session: Session, tenant_id: str, batch_id: str) -> Batch:
    batch = session.get(Batch, batch_id)
    # Another tenant's batch is indistinguishable from a missing one.
    if batch is None or batch.tenant_id != tenant_id:
        raise NotFound(f"batch '{batch_id}' does not exist", batch_id=batch_id)
    return batch


def list_(
    session: Session,
    tenant_id: str,
    *,
    deployment: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Batch], str | None]:
    """Newest first; the cursor is the last id of the previous page (ids sort by time)."""
    return tenant_page(
        session, Batch, tenant_id, deployment=deployment, status=status, limit=limit, cursor=cursor
    )


def counts(session: Session, batch_id: str) -> dict[str, int]:
    """Jobs of the batch per status (every status, zeros included)."""
    out = {s.value: 0 for s in JobStatus}
    rows = session.execute(
        select(Job.status, func.count()).where(Job.batch_id == batch_id).group_by(Job.status)
    ).all()
    for status, n in rows:
        out[status] = int(n)
    return out


def to_public(session: Session, batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.id,
        "deployment": batch.deployment_name,
        "status": batch.status,
        "total": batch.total,
        "max_in_flight": batch.max_in_flight,
        "counts": counts(session, batch.id),
        "input_uri": batch.input_uri,
        "results_uri": batch.results_uri,
        "webhook": batch.webhook_url,
        "webhook_status": batch.webhook_status,
        "created_at": iso(batch.created_at),
        "completed_at": iso(batch.completed_at),
    }


def cancel(session: Session, outbox: Outbox, tenant_id: str, batch_id: str, now: datetime) -> Batch:
    """Cancel the batch and every unfinished job of it (one transaction); returns the batch.

    A canceled batch stays canceled (repeats change nothing); a completed one is a 409. Its
    running jobs stop at their worker's next check; pending ones are never claimed.
    """
    batch = get(session, tenant_id, batch_id)
    if batch.status == COMPLETED:
        raise Conflict(f"batch '{batch_id}' is already completed", batch_id=batch_id)
    if batch.status == CANCELED:
        return batch
    active = [s.value for s in ACTIVE]
    ids = list(
        session.scalars(select(Job.id).where(Job.batch_id == batch_id, Job.status.in_(active)))
    )
    batch.status = CANCELED
    batch.completed_at = now
    ending = endings.canceled("batch_canceled")
    finish.finish(session, outbox, [(job_id, ending) for job_id in ids], now)
    return batch


def result_line(job: Job) -> bytes:
    line = {
        "index": job.batch_index,
        "job_id": job.id,
        "status": job.status,
        "output": job.output,
        "error": job.error,
    }
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def iter_results(session: Session, batch_id: str, *, terminal_only: bool) -> Iterator[bytes]:
    """Result lines in input order (only finished jobs when `terminal_only`)."""
    q = select(Job).where(Job.batch_id == batch_id)
    if terminal_only:
        q = q.where(Job.status.not_in([s.value for s in ACTIVE]))
    for job in session.scalars(q.order_by(Job.batch_index).execution_options(yield_per=500)):
        yield result_line(job)


def results_uri(settings: Settings, batch: Batch) -> str:
    return f"s3://{settings.results_bucket}/batches/{batch.tenant_id}/{batch.id}.jsonl"


def complete(
    session: Session, celery: Celery, settings: Settings, batch_id: str, now: datetime
) -> None:
    """Every line of the running batch ended: its results JSONL written to object storage,
    the batch marked completed (committed), and its `batch.completed` sent. A batch canceled
    or completed meanwhile is left as it is."""
    batch = session.get(Batch, batch_id)
    if batch is None or batch.status != RUNNING:
        return
    uri = results_uri(settings, batch)
    data = b"".join(iter_results(session, batch.id, terminal_only=False))
    object_store.write(settings, uri, data, RESULTS_CONTENT_TYPE)
    res = session.execute(
        update(Batch)
        .where(Batch.id == batch.id, Batch.status == RUNNING)
        .values(status=COMPLETED, results_uri=uri, completed_at=now)
    )
    session.commit()
    if res.rowcount == 0:  # type: ignore[attr-defined]
        return  # canceled meanwhile, or another loop finished it
    log.info("batch %s: completed, %d results at %s", batch.id, batch.total, uri)
    if batch.webhook_url:
        try:
            enqueue_batch_webhook(
                celery, batch.id, "batch.completed", signing.message_id(batch.id, "completed")
            )
        except Exception:
            log.exception("batch %s: could not enqueue its webhook", batch.id)

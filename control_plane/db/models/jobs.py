"""Jobs, the batches that group them, and each attempt to run one on a worker."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from control_plane.db.models.base import Base, utcnow
from control_plane.db.types import UTCDateTime

# The batch lines that wait for a slot (ix_jobs_batch_waiting; migration 0012).
BATCH_WAITING = "batch_id IS NOT NULL AND dispatched_at IS NULL"


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_deployment_status", "deployment_id", "status"),
        Index("ix_jobs_tenant_created", "tenant_id", "created_at"),
        # A quota check counts a tenant's active jobs on every admission: without this index it
        # reads all its history; with it, only index entries (dispatched_at is in it too).
        Index("ix_jobs_tenant_status", "tenant_id", "status", "dispatched_at"),
        Index("ix_jobs_batch_status", "batch_id", "status"),
        # The autoscaler's refresher reads a deployment's latest finished jobs every few seconds
        # (`job_queries.recent_executions`): by this index, a walk back from the newest end, not
        # a sort of every job the deployment ever ran.
        Index("ix_jobs_deployment_completed", "deployment_id", "completed_at"),
        # The reconciler looks for completed webhooks that were lost (reconcile/webhooks.py):
        # only the few jobs whose webhook is still pending are in it.
        Index(
            "ix_jobs_webhook_pending",
            "webhook_status",
            sqlite_where=text("webhook_status = 'pending'"),
            postgresql_where=text("webhook_status = 'pending'"),
        ),
        # Every reconciler tick reads the running jobs (overruns; busy workers that went idle):
        # without it, a scan of every job ever.
        Index(
            "ix_jobs_running",
            "worker_id",
            sqlite_where=text("status = 'running'"),
            postgresql_where=text("status = 'running'"),
        ),
        # A batch's next waiting lines, in input order, looked up at the end of each of its
        # lines (services/jobs/batch_slots.py): only the lines that wait for a slot are in it.
        Index(
            "ix_jobs_batch_waiting",
            "batch_id",
            "batch_index",
            sqlite_where=text(BATCH_WAITING),
            postgresql_where=text(BATCH_WAITING),
        ),
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_idempotency"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id"))
    deployment_name: Mapped[str] = mapped_column(String(100))
    deployment_version: Mapped[int] = mapped_column(Integer)
    # sync | async | batch: sync jobs are served first.
    kind: Mapped[str] = mapped_column(String(10), default="async")
    status: Mapped[str] = mapped_column(String(20), default="queued")
    status_reason: Mapped[str | None] = mapped_column(String(100), nullable=True)
    input: Mapped[dict[str, Any]] = mapped_column(JSON)
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Fencing token: bumped on every claim; a report carrying an older attempt is refused.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    generated_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    webhook_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    webhook_events: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    webhook_status: Mapped[str] = mapped_column(String(20), default="none")
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ttl_s: Mapped[float | None] = mapped_column(Numeric(12, 3, asdecimal=False), nullable=True)
    # Per-job execution limit; None = the deployment's execution_timeout_s.
    execution_timeout_s: Mapped[float | None] = mapped_column(
        Numeric(12, 3, asdecimal=False), nullable=True
    )
    # Batch membership; batch jobs get a wake-up only when the batch has a free slot.
    batch_id: Mapped[str | None] = mapped_column(
        ForeignKey("batches.id", name="fk_jobs_batch_id"), nullable=True
    )
    batch_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # When the last wake-up was sent (None: never, e.g. a batch job waiting for a slot).
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    api_key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # W3C traceparent of the span that created it (None: tracing off); its worker's spans
    # join that trace, whichever wake-up or attempt runs it (common/tracing.py).
    traceparent: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Batch(Base):
    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id"))
    deployment_name: Mapped[str] = mapped_column(String(100))
    # running | completed | canceled (counts per job state are computed from the jobs).
    status: Mapped[str] = mapped_column(String(20), default="running")
    input_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    total: Mapped[int] = mapped_column(Integer, default=0)
    # At most this many of its jobs are dispatched at once (bounded fan-out).
    max_in_flight: Mapped[int] = mapped_column(Integer, default=4)
    results_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    webhook_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    webhook_status: Mapped[str] = mapped_column(String(20), default="none")
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobAttempt(Base):
    """One execution attempt of a job on one worker (claims create them)."""

    __tablename__ = "job_attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", name="uq_job_attempts"),
        Index("ix_job_attempts_worker", "worker_id", "started_at"),
        # Billing's allocation: a worker's attempts that ended lately, or still run.
        Index("ix_job_attempts_worker_ended", "worker_id", "ended_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(40))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # succeeded | failed | canceled | timed_out | worker_lost (platform's fault: not billed)
    outcome: Mapped[str | None] = mapped_column(String(20), nullable=True)
    # The job waited on a worker booting for it (it was `starting` when claimed).
    boot_wait: Mapped[bool] = mapped_column(default=False, server_default=false())
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cached_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    generated_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)

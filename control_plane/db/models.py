"""SQL records: the source of truth for tenants, deployments, jobs, workers and billing.

The same models run on SQLite (embedded) and PostgreSQL. Schema changes go through Alembic
(`control_plane/db/migrations`). Money is Decimal, stored exactly (see `DecimalText`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
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
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Re-exported: the migrations name these types as control_plane.db.models.*.
from control_plane.db.types import DecimalText as DecimalText
from control_plane.db.types import UTCDateTime as UTCDateTime
from control_plane.domain.spec import Spec


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    # Standard Webhooks signing secret (`whsec_...`) for URLs without an endpoint of their own.
    webhook_secret: Mapped[str] = mapped_column(String(100))
    # After a rotation the previous default secret signs too, until it expires.
    previous_webhook_secret: Mapped[str | None] = mapped_column(String(100), nullable=True)
    previous_webhook_secret_expires_at: Mapped[datetime | None] = mapped_column(
        UTCDateTime, nullable=True
    )
    # The operator's tenant (the bootstrap one) may create other tenants.
    is_operator: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Quotas; None = the platform default from settings.
    requests_per_min: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_min: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_in_flight: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    # Public lookup part of the key; the secret part is only stored as a hash.
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    key_hash: Mapped[str] = mapped_column(String(128))
    # Space-separated scopes: admin deploy run read.
    scopes: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class StorageCredential(Base):
    """Credentials a tenant registered to read one of its own buckets (docs/security.md).

    The secret is stored encrypted (`services/storage/secrets_box.py`) and never returned.
    """

    __tablename__ = "storage_credentials"
    __table_args__ = (UniqueConstraint("tenant_id", "bucket", name="uq_storage_cred_bucket"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    bucket: Mapped[str] = mapped_column(String(63))
    # None: the platform's own endpoint setting (AWS itself when that is unset).
    endpoint_url: Mapped[str | None] = mapped_column(String(500), nullable=True)
    region: Mapped[str] = mapped_column(String(40), default="us-east-1")
    access_key_id: Mapped[str] = mapped_column(String(200))
    secret_ciphertext: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (
        # One live deployment per name and tenant; deleted ones keep their rows for history.
        Index(
            "uq_deployments_live_name",
            "tenant_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    # Current version; every spec change appends a DeploymentVersion.
    version: Mapped[int] = mapped_column(Integer, default=1)
    # The spec as stored (JSON); read it as `spec`, the typed object parsed from it.
    spec_doc: Mapped[dict[str, Any]] = mapped_column("spec", JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    @property
    def spec(self) -> Spec:
        """The spec parsed once per document: the reconciler reads it for every deployment in
        several steps of each tick. A new document (an update assigns one) is parsed anew;
        holding the parsed one's document keeps its identity from being reused."""
        doc = self.spec_doc
        parsed: tuple[dict[str, Any], Spec] | None = self.__dict__.get("_spec_parsed")
        if parsed is None or parsed[0] is not doc:
            parsed = (doc, Spec.from_doc(doc))
            self.__dict__["_spec_parsed"] = parsed
        return parsed[1]


class DeploymentVersion(Base):
    __tablename__ = "deployment_versions"
    __table_args__ = (UniqueConstraint("deployment_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id"))
    version: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


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


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"
    __table_args__ = (UniqueConstraint("tenant_id", "url", name="uq_webhook_endpoint_url"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(100))
    # During rotation the previous secret signs too, until it expires.
    previous_secret: Mapped[str | None] = mapped_column(String(100), nullable=True)
    previous_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # A 410 from the receiver disables the endpoint; deliveries to it stop.
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    disabled_reason: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # None: a warm-pool worker not yet assigned (its tenant is the platform's, its version 0).
    deployment_id: Mapped[str | None] = mapped_column(
        ForeignKey("deployments.id"), index=True, nullable=True
    )
    deployment_version: Mapped[int] = mapped_column(Integer)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    accelerator: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20), default="booting")
    # When the current state (= billing phase) began.
    state_since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Why the provider started or stopped it (no_capacity, scale_down, crash, ...).
    reason: Mapped[str | None] = mapped_column(String(100), nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Started for its deployment: its process start, or for a warm-pool worker its assignment.
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # When a warm-pool worker was assigned its deployment (None: booted for it).
    assigned_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # It said it takes jobs handed to it at admission (`services/jobs/handoff.py`), with no claim:
    # the platform's worker does, once serving; a worker that only claims never gets one.
    takes_handoffs: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


# The busy segments not yet split among their attempts (ix_billing_unallocated; migration 0013).
BILLING_UNALLOCATED = "phase = 'busy' AND NOT allocated"


class BillingRecord(Base):
    __tablename__ = "billing_records"
    __table_args__ = (
        # A segment can be written once: replays and redeliveries hit this constraint.
        UniqueConstraint("worker_id", "start", name="uq_billing_worker_start"),
        Index("ix_billing_tenant_start", "tenant_id", "start"),
        # The reconciler's allocation reads only these, not every record ever written.
        Index(
            "ix_billing_unallocated",
            "id",
            sqlite_where=text(BILLING_UNALLOCATED),
            postgresql_where=text(BILLING_UNALLOCATED),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    worker_id: Mapped[str] = mapped_column(ForeignKey("workers.id"))
    # None: a warm-pool segment (phase `pool`, billed to the platform's tenant).
    deployment_id: Mapped[str | None] = mapped_column(ForeignKey("deployments.id"), nullable=True)
    deployment_name: Mapped[str] = mapped_column(String(100))
    deployment_version: Mapped[int] = mapped_column(Integer)
    accelerator: Mapped[str] = mapped_column(String(20))
    phase: Mapped[str] = mapped_column(String(20))
    start: Mapped[datetime] = mapped_column(UTCDateTime)
    end: Mapped[datetime] = mapped_column(UTCDateTime)
    seconds: Mapped[Decimal] = mapped_column(DecimalText)
    # Seconds charged: `seconds`, less what policy does not bill (boot beyond max_boot_s).
    billed_seconds: Mapped[Decimal] = mapped_column(
        DecimalText, default=Decimal(0), server_default="0"
    )
    rate_per_s: Mapped[Decimal] = mapped_column(DecimalText)
    # billed_seconds × rate_per_s.
    amount: Mapped[Decimal] = mapped_column(DecimalText)
    # Why billed_seconds differs from seconds (boot_cap), or how it was closed (heartbeat).
    note: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # Busy segments: set once its amount has been split among the attempts it served.
    allocated: Mapped[bool] = mapped_column(default=False, server_default=false())


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


class CostAllocation(Base):
    """The share of one busy billing record charged to one job attempt."""

    __tablename__ = "cost_allocations"
    __table_args__ = (
        UniqueConstraint("billing_record_id", "job_id", "attempt", name="uq_cost_allocation"),
        Index("ix_cost_allocations_job", "job_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    billing_record_id: Mapped[int] = mapped_column(ForeignKey("billing_records.id"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[Decimal] = mapped_column(DecimalText)
    amount: Mapped[Decimal] = mapped_column(DecimalText)
    # False for attempts that failed through the platform's fault: absorbed, not charged.
    billable: Mapped[bool] = mapped_column(default=True)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), index=True, nullable=True)
    batch_id: Mapped[str | None] = mapped_column(
        ForeignKey("batches.id", name="fk_webhook_deliveries_batch_id"), nullable=True
    )
    url: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Standard Webhooks message id: the same for every retry of one event.
    msg_id: Mapped[str] = mapped_column(String(60))
    event_type: Mapped[str] = mapped_column(String(40))
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    delivered: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ReconcilerFence(Base):
    """One row: the fencing token of the reconciler that leads (docs/operations.md). A replica
    that takes the lease adds one to `token`; every transaction of its ticks first checks the
    row still holds its token (reconcile/fence.py), so a deposed leader's writes and provider
    calls fail instead of racing the new leader's."""

    __tablename__ = "reconciler_fence"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[int] = mapped_column(Integer, default=0)
    # The replica that took the token, and when (shown by `platform status`; diagnosis only).
    holder: Mapped[str | None] = mapped_column(String(200), nullable=True)
    taken_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

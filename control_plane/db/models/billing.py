"""Billing: a worker's time in segments, and each busy segment's split among attempts."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from control_plane.db.models.base import Base
from control_plane.db.types import DecimalText, UTCDateTime

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

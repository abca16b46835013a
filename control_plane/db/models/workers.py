"""Workers, and the fencing token of the reconciler that leads the fleet."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    ForeignKey,
    Integer,
    String,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from common.reasons import MAX_REASON_CHARS
from control_plane.db.models.base import Base, utcnow
from control_plane.db.types import UTCDateTime


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
    # The engine it runs (builtin | vllm): its deployment's, or a warm-pool worker's own, which
    # it prepared at its boot; a pool worker is assigned only deployments on that engine.
    engine: Mapped[str] = mapped_column(String(16), default="builtin", server_default="builtin")
    state: Mapped[str] = mapped_column(String(20), default="booting")
    # When the current state (= billing phase) began.
    state_since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Why the provider started or stopped it (no_capacity, scale_down, crash, ...).
    # A failure's whole reason as the worker reported it (common/reasons.py bounds it).
    reason: Mapped[str | None] = mapped_column(String(MAX_REASON_CHARS), nullable=True)
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

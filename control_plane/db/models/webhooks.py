"""Webhook endpoints a tenant registered, and every delivery attempt made to a URL."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from control_plane.db.models.base import Base, utcnow
from control_plane.db.types import UTCDateTime


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

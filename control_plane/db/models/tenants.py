"""Tenants and what each one holds for itself: API keys, storage credentials."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from control_plane.db.models.base import Base, utcnow
from control_plane.db.types import UTCDateTime


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

"""Deployments and the history of their specs (one version per change)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from common.reasons import MAX_REASON_CHARS
from control_plane.db.models.base import Base, utcnow
from control_plane.db.types import UTCDateTime
from control_plane.domain.spec import Spec

# The engine of deployments made before engines were chosen (and of rows made without one).
_EARLIER_REASON = "deployed before engines were chosen: the built-in engine"


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
    # The engine the spec's `engine` resolved to at deploy time (builtin | vllm) and why
    # (domain/engine_choice.py), decided again when the model, engine or accelerator_count
    # change; what the worker's assignment names.
    engine_resolved: Mapped[str] = mapped_column(
        String(16), default="builtin", server_default="builtin"
    )
    engine_reason: Mapped[str] = mapped_column(
        String(MAX_REASON_CHARS),
        default=_EARLIER_REASON,
        server_default=_EARLIER_REASON,
    )
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

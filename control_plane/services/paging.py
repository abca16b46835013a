"""Cursor pagination, newest first, over time-ordered ids (`job_…`, `bat_…` sort by creation)."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.orm import InstrumentedAttribute, Session

T = TypeVar("T")


def newest_first(
    session: Session,
    query: Select[T],
    id_column: InstrumentedAttribute[str],
    limit: int,
    cursor: str | None,
) -> tuple[list[T], str | None]:
    """One page of `query`; the cursor is the last id of the previous page."""
    if cursor:
        query = query.where(id_column < cursor)
    rows = list(session.scalars(query.order_by(id_column.desc()).limit(limit + 1)))
    page = rows[:limit]
    next_cursor: Any = getattr(page[-1], id_column.key) if len(rows) > limit else None
    return page, next_cursor


def tenant_page(
    session: Session,
    model: Any,
    tenant_id: str,
    *,
    deployment: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Any], str | None]:
    """One page of a tenant's rows of `model` (jobs, batches), optionally filtered by
    deployment name and status, newest first."""
    q = select(model).where(model.tenant_id == tenant_id)
    if deployment:
        q = q.where(model.deployment_name == deployment)
    if status:
        q = q.where(model.status == status)
    return newest_first(session, q, model.id, limit, cursor)

"""Deployments: named, versioned specs owned by a tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.reasons import bounded_reason
from control_plane.db import kept
from control_plane.db.models import Deployment, DeploymentVersion
from control_plane.domain.engine_choice import Choice
from control_plane.domain.ids import new_id
from control_plane.domain.spec import Spec
from control_plane.errors import Conflict, NotFound


def get(session: Session, tenant_id: str, name: str) -> Deployment:
    row = session.scalars(
        select(Deployment).where(
            Deployment.tenant_id == tenant_id,
            Deployment.name == name,
            Deployment.deleted_at.is_(None),
        )
    ).first()
    if row is None:
        raise NotFound(f"deployment '{name}' does not exist", deployment=name)
    return row


def list_(session: Session, tenant_id: str) -> list[Deployment]:
    return list(
        session.scalars(
            select(Deployment)
            .where(Deployment.tenant_id == tenant_id, Deployment.deleted_at.is_(None))
            .order_by(Deployment.name)
        )
    )


def list_live(session: Session) -> list[Deployment]:
    """Every live deployment of every tenant (for the reconciler), read once per session and
    kept until the session writes a deployment (`db.kept`): each step of a tick asks."""
    query = select(Deployment).where(Deployment.deleted_at.is_(None))
    return kept.rows(session, _LIVE_KEY, Deployment, lambda: list(session.scalars(query)))


_LIVE_KEY = "services.deployments.live"


def create(
    session: Session, tenant_id: str, spec: dict[str, Any], engine: Choice, now: datetime
) -> Deployment:
    """A new deployment of `spec`, served by `engine` (the deploy-time check's choice)."""
    row = Deployment(
        id=new_id("dep", now),
        tenant_id=tenant_id,
        name=spec["name"],
        version=1,
        spec_doc=spec,
        engine_resolved=engine.engine,
        engine_reason=bounded_reason(engine.reason),
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    session.add(DeploymentVersion(deployment_id=row.id, version=1, spec=spec, created_at=now))
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        raise Conflict(
            f"deployment '{spec['name']}' already exists; use PUT to update it"
        ) from None
    return row


def update(
    session: Session,
    tenant_id: str,
    name: str,
    spec: dict[str, Any],
    engine: Choice | None,
    now: datetime,
) -> Deployment:
    """Replace the spec; a changed spec becomes a new version (jobs keep the one they got).
    `engine`: the engine chosen anew (its model, engine or accelerator_count changed); None
    keeps the current one."""
    row = get(session, tenant_id, name)
    if row.spec_doc == spec:
        return row
    row.version += 1
    row.spec_doc = spec
    if engine is not None:
        row.engine_resolved, row.engine_reason = engine.engine, bounded_reason(engine.reason)
    row.updated_at = now
    session.add(
        DeploymentVersion(deployment_id=row.id, version=row.version, spec=spec, created_at=now)
    )
    return row


def delete(session: Session, tenant_id: str, name: str, now: datetime) -> Deployment:
    row = get(session, tenant_id, name)
    row.deleted_at = now
    return row


class Specs:
    """Deployments' current specs, for a worker's claim, cached per process by (id, version).

    A version's spec never changes (`update` makes a new version of a changed spec), so an
    entry needs no invalidation. The current version is read on every call, one column by
    primary key: an update is seen by the next claim, as when the claim loaded the whole row.
    That load (the ORM's, with the spec's JSON and its parse) cost ~0.25 ms on every job's
    path, between the claim's commit and its answer.
    """

    MAX_ENTRIES = 10_000  # past it the cache starts over

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], Spec] = {}

    def current(self, session: Session, deployment_id: str) -> Spec:
        version = session.execute(_VERSION, {"id": deployment_id}).scalar_one()
        spec = self._entries.get((deployment_id, version))
        if spec is None:
            row = session.get(Deployment, deployment_id)
            assert row is not None
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            # keyed by the version of the row read: the same as `version` unless an update
            # committed in between, and then right for that version
            self._entries[(deployment_id, row.version)] = spec = row.spec
        return spec


# built once: on a claim's path
_deployments = Deployment.metadata.tables["deployments"]
_VERSION = select(_deployments.c.version).where(_deployments.c.id == bindparam("id"))

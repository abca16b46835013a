"""/v1/deployments: create, update (new version), list, get, delete."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy.orm import Session

from control_plane.api.context import Ctx, Db, Principal, now
from control_plane.api.schemas import DeploymentList, DeploymentPublic, DeploymentSpec
from control_plane.db.models import Deployment
from control_plane.errors import InvalidRequest
from control_plane.services import deployments, workers

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])


def to_public(session: Session, dep: Deployment) -> dict[str, Any]:
    states = Counter(w.state for w in workers.live(session, dep.id))
    return {
        **dep.spec,
        "id": dep.id,
        "version": dep.version,
        "created_at": dep.created_at.isoformat().replace("+00:00", "Z"),
        "updated_at": dep.updated_at.isoformat().replace("+00:00", "Z"),
        "workers": dict(states),
    }


def _check_accelerator(ctx: Ctx, spec: DeploymentSpec) -> None:
    if spec.accelerator not in ctx.settings.rates_per_s:
        allowed = sorted(ctx.settings.rates_per_s)
        raise InvalidRequest(
            f"unknown accelerator {spec.accelerator!r}; available: {allowed}",
            errors=[{"field": "accelerator", "message": f"one of {allowed}"}],
        )


@router.post("", status_code=201, response_model=DeploymentPublic)
def create_deployment(spec: DeploymentSpec, ctx: Ctx, session: Db, who: Principal) -> Any:
    who.require("deploy")
    _check_accelerator(ctx, spec)
    dep = deployments.create(session, who.tenant_id, spec.model_dump(), now())
    session.commit()
    return to_public(session, dep)


@router.put("/{name}", response_model=DeploymentPublic)
def update_deployment(
    name: str, spec: DeploymentSpec, ctx: Ctx, session: Db, who: Principal
) -> Any:
    who.require("deploy")
    if spec.name != name:
        raise InvalidRequest(
            f"body name {spec.name!r} does not match the path {name!r}",
            errors=[{"field": "name", "message": "must match the URL"}],
        )
    _check_accelerator(ctx, spec)
    dep = deployments.update(session, who.tenant_id, name, spec.model_dump(), now())
    session.commit()
    return to_public(session, dep)


@router.get("", response_model=DeploymentList)
def list_deployments(session: Db, who: Principal) -> Any:
    who.require("read")
    return {"data": [to_public(session, d) for d in deployments.list_(session, who.tenant_id)]}


@router.get("/{name}", response_model=DeploymentPublic)
def get_deployment(name: str, session: Db, who: Principal) -> Any:
    who.require("read")
    return to_public(session, deployments.get(session, who.tenant_id, name))


@router.delete("/{name}", status_code=204)
def delete_deployment(name: str, session: Db, who: Principal) -> Response:
    who.require("deploy")
    deployments.delete(session, who.tenant_id, name, now())
    session.commit()
    return Response(status_code=204)

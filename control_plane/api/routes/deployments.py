"""/v1/deployments: create, update (new version), list, get, delete."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Query, Response
from sqlalchemy.orm import Session

from control_plane.api.context import Ctx, Db, Now, Principal
from control_plane.api.responses import DeploymentList, DeploymentPublic
from control_plane.api.schemas import DeploymentSpec
from control_plane.db.models import Deployment
from control_plane.domain import engine_choice
from control_plane.domain.clock import iso
from control_plane.domain.engine_choice import Checkpoint, Choice, EngineRefused
from control_plane.domain.spec import Spec
from control_plane.errors import InvalidRequest
from control_plane.services import deployments
from control_plane.services.models import model_check
from control_plane.services.scaling import scale_decisions
from control_plane.services.storage import storage_access
from control_plane.services.workers import worker_records

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])


def to_public(
    session: Session, dep: Deployment, scaling: dict[str, Any] | None = None
) -> dict[str, Any]:
    states = Counter(w.state for w in worker_records.live(session, dep.id))
    return {
        **dep.spec_doc,
        "engine": dep.spec.engine,  # the default for specs stored before it existed
        "engine_resolved": dep.engine_resolved,
        "engine_reason": dep.engine_reason,
        "id": dep.id,
        "version": dep.version,
        "created_at": iso(dep.created_at),
        "updated_at": iso(dep.updated_at),
        "workers": dict(states),
        "scaling": scaling,
    }


def with_scaling(ctx: Ctx, session: Session, deps: list[Deployment]) -> list[dict[str, Any]]:
    """The deployments with the autoscaler's latest decision each (one Redis round trip)."""
    latest = scale_decisions.latest(ctx.redis, [d.id for d in deps])
    return [to_public(session, d, latest.get(d.id)) for d in deps]


NOT_CHECKED = "models are not read at deploy on this platform (PLATFORM_VALIDATE_MODELS is off)"


def _check(
    ctx: Ctx, session: Session, tenant_id: str, spec: DeploymentSpec, current: Spec | None
) -> Choice | None:
    """Refuse, before anything is written, a spec this tenant may not run: an unknown
    accelerator, a model outside what the tenant may read (docs/security.md), one a worker
    would not load (services/models/model_check.py), or one no engine it allows can serve.
    The engine chosen when the model, engine or accelerator_count are new or changed; None
    when they are not (the deployment keeps its engine)."""
    _check_accelerator(ctx, spec)
    access = storage_access.resolve(session, ctx.settings, tenant_id, spec.model, "model")
    if current is not None and (current.model, current.engine, current.accelerator_count) == (
        spec.model,
        spec.engine,
        spec.accelerator_count,
    ):
        return None
    model_changed = current is None or current.model != spec.model
    if not ctx.settings.validate_models:
        checkpoint = Checkpoint.unread(NOT_CHECKED)
    elif model_changed:
        checkpoint = model_check.check_model(access)
    else:  # its weights were checked when it was deployed
        checkpoint = model_check.read_checkpoint(access)
    platform = engine_choice.Platform(has_vllm=ctx.settings.has_vllm())
    try:
        return engine_choice.choose(spec.engine, checkpoint, spec.accelerator_count, platform)
    except EngineRefused as exc:
        raise InvalidRequest(
            f"model {spec.model}: {exc.summary}",
            errors=[{"field": r.field, "message": r.message} for r in exc.refusals],
        ) from None


def _check_accelerator(ctx: Ctx, spec: DeploymentSpec) -> None:
    allowed = ctx.settings.offered_accelerators()
    if spec.accelerator not in allowed:
        raise InvalidRequest(
            f"unknown accelerator {spec.accelerator!r}; available: {allowed}",
            errors=[{"field": "accelerator", "message": f"one of {allowed}"}],
        )


DryRun = Query(
    False, description="run every check and answer what would be written, writing nothing"
)


@router.post(
    "",
    status_code=201,
    response_model=DeploymentPublic,
    responses={200: {"model": DeploymentPublic, "description": "dry_run: what would be created"}},
)
def create_deployment(
    spec: DeploymentSpec,
    ctx: Ctx,
    session: Db,
    who: Principal,
    at: Now,
    response: Response,
    dry_run: bool = DryRun,
) -> Any:
    who.require("deploy")
    engine = _check(ctx, session, who.tenant_id, spec, None)
    assert engine is not None, "a new deployment's engine is always chosen"
    dep = deployments.create(session, who.tenant_id, spec.model_dump(), engine, at)
    body = to_public(session, dep)
    if dry_run:
        # NOTE: the row was only flushed (so a taken name answers 409 here too); rolled back.
        session.rollback()
        response.status_code = 200
        return body
    session.commit()
    ctx.model_meta.prefetch(dep.id, dep.version, dep.tenant_id, dep.spec.model)
    return body


@router.put("/{name}", response_model=DeploymentPublic)
def update_deployment(
    name: str,
    spec: DeploymentSpec,
    ctx: Ctx,
    session: Db,
    who: Principal,
    at: Now,
    dry_run: bool = DryRun,
) -> Any:
    who.require("deploy")
    if spec.name != name:
        raise InvalidRequest(
            f"body name {spec.name!r} does not match the path {name!r}",
            errors=[{"field": "name", "message": "must match the URL"}],
        )
    current = deployments.get(session, who.tenant_id, name)
    engine = _check(ctx, session, who.tenant_id, spec, current.spec)
    dep = deployments.update(session, who.tenant_id, name, spec.model_dump(), engine, at)
    body = with_scaling(ctx, session, [dep])[0]
    if dry_run:
        session.rollback()
        return body
    session.commit()
    ctx.model_meta.prefetch(dep.id, dep.version, dep.tenant_id, dep.spec.model)
    return body


@router.get("", response_model=DeploymentList)
def list_deployments(ctx: Ctx, session: Db, who: Principal) -> Any:
    who.require("read")
    return {"data": with_scaling(ctx, session, deployments.list_(session, who.tenant_id))}


@router.get("/{name}", response_model=DeploymentPublic)
def get_deployment(name: str, ctx: Ctx, session: Db, who: Principal) -> Any:
    """The deployment, its live workers and the autoscaler's latest decision (`scaling`)."""
    who.require("read")
    return with_scaling(ctx, session, [deployments.get(session, who.tenant_id, name)])[0]


@router.delete("/{name}", status_code=204)
def delete_deployment(name: str, session: Db, who: Principal, at: Now) -> Response:
    who.require("deploy")
    deployments.delete(session, who.tenant_id, name, at)
    session.commit()
    return Response(status_code=204)

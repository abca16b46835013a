"""/v1/webhooks/endpoints (per-tenant endpoints with their own secrets, rotation), and a job's
or batch's webhook delivery log and redelivery."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.context import Ctx, Db, Principal, now
from control_plane.domain.states import is_terminal
from control_plane.errors import Conflict
from control_plane.services import batches, jobs, webhook_delivery, webhook_endpoints, webhooks
from control_plane.tasks_api import enqueue_webhook

router = APIRouter(tags=["webhooks"])


class EndpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2_000)


@router.post("/v1/webhooks/endpoints", status_code=201)
def create_endpoint(body: EndpointCreate, ctx: Ctx, session: Db, who: Principal) -> Any:
    who.require("admin")
    webhooks.check_target(body.url, ctx.settings.webhook_allow_private, field="url")
    ep = webhook_endpoints.create(session, who.tenant_id, body.url, now())
    session.commit()
    return JSONResponse(webhook_endpoints.to_public(ep, with_secret=True), status_code=201)


@router.get("/v1/webhooks/endpoints")
def list_endpoints(session: Db, who: Principal) -> Any:
    who.require("admin")
    rows = webhook_endpoints.list_(session, who.tenant_id)
    return {"data": [webhook_endpoints.to_public(ep, with_secret=False) for ep in rows]}


@router.get("/v1/webhooks/endpoints/{endpoint_id}")
def get_endpoint(endpoint_id: str, session: Db, who: Principal) -> Any:
    who.require("admin")
    ep = webhook_endpoints.get(session, who.tenant_id, endpoint_id)
    return webhook_endpoints.to_public(ep, with_secret=True)


@router.delete("/v1/webhooks/endpoints/{endpoint_id}", status_code=204)
def delete_endpoint(endpoint_id: str, session: Db, who: Principal) -> Response:
    who.require("admin")
    webhook_endpoints.delete(session, who.tenant_id, endpoint_id)
    session.commit()
    return Response(status_code=204)


@router.post("/v1/webhooks/endpoints/{endpoint_id}/rotate")
def rotate_endpoint(endpoint_id: str, ctx: Ctx, session: Db, who: Principal) -> Any:
    who.require("admin")
    ep = webhook_endpoints.rotate(
        session, who.tenant_id, endpoint_id, now(), ctx.settings.webhook_rotation_overlap_s
    )
    session.commit()
    return webhook_endpoints.to_public(ep, with_secret=True)


@router.get("/v1/jobs/{job_id}/webhook/deliveries")
def job_deliveries(job_id: str, session: Db, who: Principal) -> Any:
    who.require("read")
    job = jobs.get(session, who.tenant_id, job_id)
    rows = webhook_delivery.deliveries(session, job_id=job.id)
    return {"data": [webhook_delivery.delivery_public(d) for d in rows]}


@router.post("/v1/jobs/{job_id}/webhook/redeliver", status_code=202)
def redeliver(job_id: str, ctx: Ctx, session: Db, who: Principal) -> Any:
    """Send `job.completed` of a finished job again, as a new message (fresh webhook-id)."""
    who.require("run")
    job = jobs.get(session, who.tenant_id, job_id)
    if not is_terminal(job.status):
        raise Conflict(f"job '{job_id}' is {job.status}; only a finished job is redelivered")
    if not job.webhook_url:
        raise Conflict(f"job '{job_id}' has no webhook")
    job.webhook_status = "pending"
    session.commit()
    msg_id = f"msg_{job.id}_completed_r{secrets.token_hex(4)}"
    enqueue_webhook(ctx.celery, job.id, "job.completed", msg_id)
    return JSONResponse({"job_id": job.id, "msg_id": msg_id}, status_code=202)


@router.get("/v1/batches/{batch_id}/webhook/deliveries")
def batch_deliveries(batch_id: str, session: Db, who: Principal) -> Any:
    who.require("read")
    batch = batches.get(session, who.tenant_id, batch_id)
    rows = webhook_delivery.deliveries(session, batch_id=batch.id)
    return {"data": [webhook_delivery.delivery_public(d) for d in rows]}

"""/v1/webhooks/endpoints (per-tenant endpoints with their own secrets, rotation), and a job's
or batch's webhook delivery log and redelivery."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.context import Ctx, Db, Now, Principal
from control_plane.api.responses import WebhookSecret
from control_plane.api.schemas import Line
from control_plane.db.models import Tenant
from control_plane.domain.states import is_terminal
from control_plane.errors import Conflict
from control_plane.services.jobs import batches, job_store, webhook_delivery
from control_plane.services.webhooks import endpoints, signing, targets
from control_plane.tasks_api import enqueue_webhook

router = APIRouter(tags=["webhooks"])


class EndpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: Line = Field(max_length=2_000)


class EndpointPublic(BaseModel):
    id: str
    url: str
    created_at: str
    disabled_at: str | None  # set after the receiver answered 410; nothing is sent then
    disabled_reason: str | None
    previous_secret_expires_at: str | None  # the previous secret signs too until then


class EndpointWithSecret(EndpointPublic):
    secret: str  # whsec_…: only in answers about one endpoint (admin scope)


class EndpointList(BaseModel):
    data: list[EndpointPublic]


class DeliveryPublic(BaseModel):
    msg_id: str  # webhook-id: the same for every attempt of one event
    event_type: str
    attempt: int
    url: str | None
    status_code: int | None  # None: no answer (transport error) or not sent
    error: str | None
    delivered: bool
    created_at: str


class DeliveryList(BaseModel):
    data: list[DeliveryPublic]


class Redelivery(BaseModel):
    job_id: str
    msg_id: str  # webhook-id of the new message


@router.post("/v1/webhooks/endpoints", status_code=201, response_model=EndpointWithSecret)
def create_endpoint(body: EndpointCreate, ctx: Ctx, session: Db, who: Principal, at: Now) -> Any:
    who.require("admin")
    targets.check_target(body.url, ctx.settings.webhook_allow_private, field="url")
    ep = endpoints.create(session, who.tenant_id, body.url, at)
    session.commit()
    return JSONResponse(endpoints.to_public(ep, with_secret=True), status_code=201)


@router.get("/v1/webhooks/endpoints", response_model=EndpointList)
def list_endpoints(session: Db, who: Principal) -> Any:
    who.require("admin")
    rows = endpoints.list_(session, who.tenant_id)
    return {"data": [endpoints.to_public(ep, with_secret=False) for ep in rows]}


@router.get("/v1/webhooks/endpoints/{endpoint_id}", response_model=EndpointWithSecret)
def get_endpoint(endpoint_id: str, session: Db, who: Principal) -> Any:
    who.require("admin")
    ep = endpoints.get(session, who.tenant_id, endpoint_id)
    return endpoints.to_public(ep, with_secret=True)


@router.delete("/v1/webhooks/endpoints/{endpoint_id}", status_code=204)
def delete_endpoint(endpoint_id: str, session: Db, who: Principal) -> Response:
    who.require("admin")
    endpoints.delete(session, who.tenant_id, endpoint_id)
    session.commit()
    return Response(status_code=204)


@router.get("/v1/webhooks/secret", response_model=WebhookSecret)
def webhook_secret(session: Db, who: Principal, at: Now) -> Any:
    """The tenant's default signing secret (URLs without an endpoint of their own)."""
    who.require("admin")
    tenant = session.get(Tenant, who.tenant_id)
    assert tenant is not None
    return endpoints.default_secret_to_public(tenant, at)


@router.post("/v1/webhooks/secret/rotate", response_model=WebhookSecret)
def rotate_webhook_secret(ctx: Ctx, session: Db, who: Principal, at: Now) -> Any:
    """A new default secret; the current one keeps signing for the rotation overlap."""
    who.require("admin")
    tenant = endpoints.rotate_default(
        session, who.tenant_id, at, ctx.settings.webhook_rotation_overlap_s
    )
    session.commit()
    return endpoints.default_secret_to_public(tenant, at)


@router.post("/v1/webhooks/endpoints/{endpoint_id}/rotate", response_model=EndpointWithSecret)
def rotate_endpoint(endpoint_id: str, ctx: Ctx, session: Db, who: Principal, at: Now) -> Any:
    who.require("admin")
    ep = endpoints.rotate(
        session, who.tenant_id, endpoint_id, at, ctx.settings.webhook_rotation_overlap_s
    )
    session.commit()
    return endpoints.to_public(ep, with_secret=True)


@router.get("/v1/jobs/{job_id}/webhook/deliveries", response_model=DeliveryList)
def job_deliveries(job_id: str, session: Db, who: Principal) -> Any:
    who.require("read")
    job = job_store.get(session, who.tenant_id, job_id)
    rows = webhook_delivery.deliveries(session, job_id=job.id)
    return {"data": [webhook_delivery.delivery_public(d) for d in rows]}


@router.post("/v1/jobs/{job_id}/webhook/redeliver", status_code=202, response_model=Redelivery)
def redeliver(job_id: str, ctx: Ctx, session: Db, who: Principal) -> Any:
    """Send `job.completed` of a finished job again, as a new message (fresh webhook-id)."""
    who.require("run")
    job = job_store.get(session, who.tenant_id, job_id)
    if not is_terminal(job.status):
        raise Conflict(f"job '{job_id}' is {job.status}; only a finished job is redelivered")
    if not job.webhook_url:
        raise Conflict(f"job '{job_id}' has no webhook")
    job.webhook_status = "pending"
    session.commit()
    msg_id = signing.message_id(job.id, "completed", "r" + secrets.token_hex(4))
    enqueue_webhook(ctx.celery, job.id, "job.completed", msg_id)
    return JSONResponse({"job_id": job.id, "msg_id": msg_id}, status_code=202)


@router.get("/v1/batches/{batch_id}/webhook/deliveries", response_model=DeliveryList)
def batch_deliveries(batch_id: str, session: Db, who: Principal) -> Any:
    who.require("read")
    batch = batches.get(session, who.tenant_id, batch_id)
    rows = webhook_delivery.deliveries(session, batch_id=batch.id)
    return {"data": [webhook_delivery.delivery_public(d) for d in rows]}

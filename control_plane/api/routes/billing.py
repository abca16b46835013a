"""Billing records, workers and the tenant's webhook secret."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from control_plane.api.context import Db, Principal
from control_plane.api.schemas import BillingRecordList, WebhookSecret, WorkerList
from control_plane.db.models import BillingRecord, Deployment, Tenant
from control_plane.domain.billing_math import AMOUNT_QUANTUM, SECONDS_QUANTUM
from control_plane.services import workers

router = APIRouter(tags=["billing"])


def _record_public(r: BillingRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "worker_id": r.worker_id,
        "deployment": r.deployment_name,
        "deployment_version": r.deployment_version,
        "accelerator": r.accelerator,
        "phase": r.phase,
        "start": r.start.isoformat().replace("+00:00", "Z"),
        "end": r.end.isoformat().replace("+00:00", "Z"),
        # Fixed-point strings at fixed precision ("0.000000200", never "2.00E-7" nor a
        # backend-dependent scale): money is never a float.
        "seconds": f"{r.seconds.quantize(SECONDS_QUANTUM):f}",
        "rate_per_s": f"{r.rate_per_s.quantize(AMOUNT_QUANTUM):f}",
        "amount": f"{r.amount.quantize(AMOUNT_QUANTUM):f}",
    }


@router.get("/v1/billing/records", response_model=BillingRecordList)
def billing_records(
    session: Db,
    who: Principal,
    deployment: str | None = None,
    worker_id: str | None = None,
    phase: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=0, le=2**62)] = None,
) -> Any:
    who.require("read")
    q = select(BillingRecord).where(BillingRecord.tenant_id == who.tenant_id)
    if deployment:
        q = q.where(BillingRecord.deployment_name == deployment)
    if worker_id:
        q = q.where(BillingRecord.worker_id == worker_id)
    if phase:
        q = q.where(BillingRecord.phase == phase)
    if cursor is not None:
        q = q.where(BillingRecord.id > cursor)
    rows = list(session.scalars(q.order_by(BillingRecord.id).limit(limit + 1)))
    next_cursor = str(rows[limit - 1].id) if len(rows) > limit else None
    return {"data": [_record_public(r) for r in rows[:limit]], "next_cursor": next_cursor}


@router.get("/v1/workers", response_model=WorkerList)
def list_workers(session: Db, who: Principal, deployment: str | None = None) -> Any:
    who.require("read")
    names = {
        d.id: d.name
        for d in session.scalars(select(Deployment).where(Deployment.tenant_id == who.tenant_id))
    }
    dep_id = next((i for i, n in names.items() if n == deployment), "none") if deployment else None
    rows = workers.list_for_tenant(session, who.tenant_id, dep_id)
    return {"data": [workers.to_public(w, names.get(w.deployment_id, "?")) for w in rows]}


@router.get("/v1/webhooks/secret", response_model=WebhookSecret)
def webhook_secret(session: Db, who: Principal) -> Any:
    who.require("admin")
    tenant = session.get(Tenant, who.tenant_id)
    assert tenant is not None
    return {"secret": tenant.webhook_secret}

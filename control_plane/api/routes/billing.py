"""Billing records, workers and the tenant's webhook secret."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from sqlalchemy import select

from control_plane.api.context import Db, Now, Principal
from control_plane.api.responses import (
    BillingCheck,
    BillingRecordList,
    PoolView,
    UsageList,
    UsageSummary,
    WorkerList,
)
from control_plane.db.models import BillingRecord, Deployment, Tenant
from control_plane.domain.billing_math import AMOUNT_QUANTUM, SECONDS_QUANTUM
from control_plane.domain.clock import iso
from control_plane.errors import Forbidden
from control_plane.services.workers import billing, worker_records

router = APIRouter(tags=["billing"])


def _record_public(r: BillingRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "worker_id": r.worker_id,
        "deployment": r.deployment_name,
        "deployment_version": r.deployment_version,
        "accelerator": r.accelerator,
        "phase": r.phase,
        "start": iso(r.start),
        "end": iso(r.end),
        # Fixed-point strings at fixed precision ("0.000000200", never "2.00E-7" nor a
        # backend-dependent scale): money is never a float.
        "seconds": f"{r.seconds.quantize(SECONDS_QUANTUM):f}",
        "billed_seconds": f"{r.billed_seconds.quantize(SECONDS_QUANTUM):f}",
        "note": r.note,
        "rate_per_s": f"{r.rate_per_s.quantize(AMOUNT_QUANTUM):f}",
        "amount": f"{r.amount.quantize(AMOUNT_QUANTUM):f}",
    }


Format = Literal["json", "csv", "jsonl"]


def export(rows: list[dict[str, Any]], fmt: Format, name: str) -> Response:
    """CSV or JSONL download of `rows` (money as decimal strings in both)."""
    if fmt == "jsonl":
        body = "".join(json.dumps(r) + "\n" for r in rows)
        return Response(
            body,
            media_type="application/jsonl",
            headers={"Content-Disposition": f'attachment; filename="{name}.jsonl"'},
        )
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow(
                {k: (json.dumps(v) if isinstance(v, list | dict) else v) for k, v in r.items()}
            )
    return Response(
        out.getvalue(),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}.csv"'},
    )


@router.get(
    "/v1/billing/records",
    response_model=BillingRecordList,
    responses={200: {"content": {"text/csv": {}, "application/jsonl": {}}}},
)
def billing_records(
    session: Db,
    who: Principal,
    deployment: str | None = None,
    worker_id: str | None = None,
    phase: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    cursor: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    format: Format = "json",
) -> Any:
    """Every closed segment of every worker: phase, seconds, billed seconds, rate, amount."""
    who.require("read")
    q = select(BillingRecord).where(BillingRecord.tenant_id == who.tenant_id)
    if since:
        q = q.where(BillingRecord.start >= _utc(since))
    if until:
        q = q.where(BillingRecord.start < _utc(until))
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
    data = [_record_public(r) for r in rows[:limit]]
    if format != "json":
        return export(data, format, "billing-records")
    return {"data": data, "next_cursor": next_cursor}


def _utc(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


@router.get(
    "/v1/usage",
    response_model=UsageList,
    responses={200: {"content": {"text/csv": {}, "application/jsonl": {}}}},
)
def usage(
    session: Db,
    who: Principal,
    deployment: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    format: Format = "json",
) -> Any:
    """Per job: queue, boot wait, execution, billed seconds, tokens, cost share."""
    who.require("read")
    rows, next_cursor = billing.usage(
        session,
        who.tenant_id,
        deployment=deployment,
        since=since and _utc(since),
        until=until and _utc(until),
        limit=limit,
        cursor=cursor,
    )
    if format != "json":
        return export(rows, format, "usage")
    return {"data": rows, "next_cursor": next_cursor}


@router.get("/v1/usage/summary", response_model=UsageSummary)
def usage_summary(
    session: Db,
    who: Principal,
    group_by: Literal["deployment", "day", "hour", "api_key", "phase"] = "deployment",
    since: datetime | None = None,
    until: datetime | None = None,
) -> Any:
    who.require("read")
    groups = billing.summary(
        session, who.tenant_id, group_by, since and _utc(since), until and _utc(until)
    )
    total = sum((Decimal(g["amount"]) for g in groups), Decimal(0))
    return {"group_by": group_by, "data": groups, "total_amount": f"{total:f}"}


@router.get("/v1/billing/check", response_model=BillingCheck)
def billing_check(session: Db, who: Principal, at: Now) -> Any:
    """Drift between billing records, workers and jobs (empty `issues`: the books balance)."""
    who.require("admin")
    issues = billing.check(session, who.tenant_id, at)
    return {"ok": not issues, "issues": issues}


@router.get("/v1/workers", response_model=WorkerList)
def list_workers(session: Db, who: Principal, deployment: str | None = None) -> Any:
    who.require("read")
    names = {
        d.id: d.name
        for d in session.scalars(select(Deployment).where(Deployment.tenant_id == who.tenant_id))
    }
    dep_id = next((i for i, n in names.items() if n == deployment), "none") if deployment else None
    rows = worker_records.list_for_tenant(session, who.tenant_id, dep_id)
    return {
        "data": [worker_records.to_public(w, names.get(w.deployment_id or "", "?")) for w in rows]
    }


@router.get("/v1/pool", response_model=PoolView)
def warm_pool(session: Db, who: Principal) -> Any:
    """The warm pool: generic workers booted ahead of cold starts, no deployment's yet, each
    prepared for one engine (it is given only deployments on that engine).

    The pool is the platform's (billed to it, phase `pool`), so only the operator's keys read
    it; a tenant sees where its workers came from in its deployments' `scaling.placement`."""
    who.require("read")
    tenant = session.get(Tenant, who.tenant_id)
    if tenant is None or not tenant.is_operator:
        raise Forbidden("the warm pool is the platform's: only the operator's keys may read it")
    rows = worker_records.pooled(session)
    counts: dict[str, dict[str, int]] = {}
    by_engine: dict[str, dict[str, dict[str, int]]] = {}
    for w in rows:
        by_state = counts.setdefault(w.accelerator, {})
        by_state[w.state] = by_state.get(w.state, 0) + 1
        of_engine = by_engine.setdefault(w.engine, {}).setdefault(w.accelerator, {})
        of_engine[w.state] = of_engine.get(w.state, 0) + 1
    return {
        "data": [
            {
                "id": w.id,
                "accelerator": w.accelerator,
                "engine": w.engine,
                "state": w.state,
                "started_at": iso(w.started_at),
                "state_since": iso(w.state_since),
            }
            for w in rows
        ],
        "counts": counts,
        "counts_by_engine": by_engine,
    }

"""/v1/keys (a tenant's API keys) and /v1/tenants (the operator's)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.context import Db, Now, Principal
from control_plane.api.responses import KeyCreated, KeyList, KeyPublic, TenantCreated, TenantList
from control_plane.api.schemas import Line
from control_plane.db.models import ApiKey, Tenant
from control_plane.domain.clock import iso
from control_plane.errors import NotFound
from control_plane.services.tenants import api_keys

router = APIRouter(tags=["keys"])


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Line = Field("", max_length=200)
    scopes: list[Line] = Field(default_factory=lambda: ["run", "read"], min_length=1)


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Line = Field(min_length=1, max_length=200)
    # Bounded: stored as 32-bit integers.
    requests_per_min: int | None = Field(None, ge=1, le=1_000_000_000)
    tokens_per_min: int | None = Field(None, ge=1, le=1_000_000_000)
    max_in_flight: int | None = Field(None, ge=1, le=1_000_000_000)


def _check_scopes(scopes: list[str]) -> None:
    from control_plane.errors import InvalidRequest

    unknown = sorted(set(scopes) - api_keys.SCOPES)
    if unknown:
        raise InvalidRequest(
            f"unknown scopes {unknown}; allowed: {sorted(api_keys.SCOPES)}",
            errors=[{"field": "scopes", "message": f"one of {sorted(api_keys.SCOPES)}"}],
        )


@router.post("/v1/keys", status_code=201, response_model=KeyCreated)
def create_key(body: KeyCreate, session: Db, who: Principal, at: Now) -> Any:
    """Create an API key; its secret is in this answer only (stored hashed)."""
    who.require("admin")
    _check_scopes(body.scopes)
    row, full = api_keys.create_api_key(session, who.tenant_id, set(body.scopes), at, body.name)
    session.commit()
    return {**api_keys.key_public(row), "key": full}


@router.get("/v1/keys", response_model=KeyList)
def list_keys(session: Db, who: Principal) -> Any:
    who.require("admin")
    return {"data": [api_keys.key_public(k) for k in api_keys.list_keys(session, who.tenant_id)]}


@router.get("/v1/keys/current", response_model=KeyPublic)
def current_key(session: Db, who: Principal) -> Any:
    """The key that signs this request: its name, prefix and scopes (never its secret). Any
    valid key may read itself: the console greys out what its scopes do not allow."""
    row = session.get(ApiKey, who.key_id)
    if row is None:  # revoked and deleted between authentication and here
        raise NotFound("this API key no longer exists")
    return api_keys.key_public(row)


@router.delete("/v1/keys/{key_id}", status_code=204)
def revoke_key(key_id: str, session: Db, who: Principal, at: Now) -> Response:
    who.require("admin")
    api_keys.revoke_key(session, who.tenant_id, key_id, at)
    session.commit()
    return Response(status_code=204)


def _tenant_public(t: Tenant) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "requests_per_min": t.requests_per_min,
        "tokens_per_min": t.tokens_per_min,
        "max_in_flight": t.max_in_flight,
        "created_at": iso(t.created_at),
    }


@router.post("/v1/tenants", status_code=201, response_model=TenantCreated)
def create_tenant(body: TenantCreate, session: Db, who: Principal, at: Now) -> Any:
    """Operator only: a new tenant and its first admin key (shown once)."""
    api_keys.require_operator(session, who)
    t = at
    tenant = api_keys.create_tenant(session, body.name, t)
    tenant.requests_per_min = body.requests_per_min
    tenant.tokens_per_min = body.tokens_per_min
    tenant.max_in_flight = body.max_in_flight
    session.flush()
    row, full = api_keys.create_api_key(session, tenant.id, {"admin"}, t, name="initial admin")
    session.commit()
    return {**_tenant_public(tenant), "admin_key": {**api_keys.key_public(row), "key": full}}


@router.get("/v1/tenants", response_model=TenantList)
def list_tenants(session: Db, who: Principal) -> Any:
    from sqlalchemy import select

    api_keys.require_operator(session, who)
    rows = session.scalars(select(Tenant).order_by(Tenant.created_at))
    return {"data": [_tenant_public(t) for t in rows]}

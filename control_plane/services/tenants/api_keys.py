"""Tenants and API keys: random secrets shown once, stored hashed, looked up by prefix."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import ApiKey, Tenant
from control_plane.domain.clock import iso
from control_plane.domain.ids import new_id
from control_plane.errors import Forbidden, NotFound, Unauthorized

SCOPES = frozenset({"admin", "deploy", "run", "read"})
KEY_PREFIX = "pk"


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str  # tenant every resource of this request belongs to
    key_id: str  # API key that authenticated the request
    scopes: frozenset[str]  # granted scopes; admin implies all

    def require(self, scope: str) -> None:
        if "admin" not in self.scopes and scope not in self.scopes:
            raise Forbidden(f"this API key lacks the '{scope}' scope")


def _hash_secret(secret: str) -> str:
    # Secrets carry 192 random bits, so a fast hash is enough (no password stretching needed).
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_key() -> tuple[str, str, str]:
    """(full key, lookup prefix, secret); the full key is `pk_<prefix>_<secret>`."""
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(24)
    return f"{KEY_PREFIX}_{prefix}_{secret}", prefix, secret


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def create_tenant(
    session: Session, name: str, now: datetime, tenant_id: str | None = None
) -> Tenant:
    tenant = Tenant(
        id=tenant_id or new_id("ten", now),
        name=name,
        webhook_secret=new_webhook_secret(),
        created_at=now,
    )
    session.add(tenant)
    return tenant


def create_api_key(
    session: Session, tenant_id: str, scopes: set[str], now: datetime, name: str = ""
) -> tuple[ApiKey, str]:
    """Store a new key; returns the row and the full key, which is never retrievable again."""
    unknown = scopes - SCOPES
    if unknown:
        raise ValueError(f"unknown scopes {sorted(unknown)}; allowed: {sorted(SCOPES)}")
    full, prefix, secret = generate_key()
    row = ApiKey(
        id=new_id("key", now),
        tenant_id=tenant_id,
        prefix=prefix,
        key_hash=_hash_secret(secret),
        scopes=" ".join(sorted(scopes)),
        name=name,
        created_at=now,
    )
    session.add(row)
    return row, full


def install_key(
    session: Session, tenant_id: str, full_key: str, scopes: set[str], now: datetime, name: str
) -> ApiKey:
    """Store a key chosen by the caller (the embedded platform's persisted bootstrap key)."""
    prefix, secret = _split(full_key)
    row = ApiKey(
        id=new_id("key", now),
        tenant_id=tenant_id,
        prefix=prefix,
        key_hash=_hash_secret(secret),
        scopes=" ".join(sorted(scopes)),
        name=name,
        created_at=now,
    )
    session.add(row)
    return row


def well_formed(full_key: str) -> bool:
    """Whether `full_key` has the shape of a key (`pk_<prefix>_<secret>`); not that it exists."""
    try:
        _split(full_key)
    except Unauthorized:
        return False
    return True


def _split(full_key: str) -> tuple[str, str]:
    parts = full_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        raise Unauthorized("malformed API key")
    return parts[1], parts[2]


def authenticate(session: Session, full_key: str) -> Principal:
    prefix, secret = _split(full_key)
    row = session.scalars(select(ApiKey).where(ApiKey.prefix == prefix)).first()
    # Compare even when the prefix is unknown, so timing does not reveal which prefixes exist.
    expected = row.key_hash if row is not None else _hash_secret("x")
    ok = hmac.compare_digest(expected, _hash_secret(secret))
    if row is None or not ok or row.revoked_at is not None:
        raise Unauthorized("invalid or revoked API key")
    return Principal(row.tenant_id, row.id, frozenset(row.scopes.split()))


def bootstrap(session: Session, admin_key: str, now: datetime) -> str:
    """Ensure a default tenant whose admin key is `admin_key`; returns the tenant id."""
    prefix, _ = _split(admin_key)
    existing = session.scalars(select(ApiKey).where(ApiKey.prefix == prefix)).first()
    if existing is not None:
        return existing.tenant_id
    tenant = create_tenant(session, "default", now)
    tenant.is_operator = True
    session.flush()
    install_key(session, tenant.id, admin_key, {"admin"}, now, name="bootstrap")
    return tenant.id


def list_keys(session: Session, tenant_id: str) -> list[ApiKey]:
    return list(
        session.scalars(
            select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)
        )
    )


def revoke_key(session: Session, tenant_id: str, key_id: str, now: datetime) -> ApiKey:
    """Revoke at once: every request re-checks its key, so the next one is refused."""
    row = session.get(ApiKey, key_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"API key '{key_id}' does not exist")
    if row.revoked_at is None:
        row.revoked_at = now
    return row


def key_public(row: ApiKey) -> dict[str, object]:
    """A key as shown after creation: never its secret or hash."""
    return {
        "id": row.id,
        "name": row.name,
        "prefix": f"{KEY_PREFIX}_{row.prefix}",
        "scopes": row.scopes.split(),
        "created_at": iso(row.created_at),
        "revoked_at": iso(row.revoked_at),
    }


def require_operator(session: Session, principal: Principal) -> None:
    principal.require("admin")
    tenant = session.get(Tenant, principal.tenant_id)
    if tenant is None or not tenant.is_operator:
        raise Forbidden("only the operator's admin keys may manage tenants")

"""Per-tenant webhook endpoints: their signing secrets, rotation, and disabling after a 410.

A job or batch whose webhook URL equals (byte for byte) the URL of one of its tenant's endpoints
is signed with that endpoint's secret(s); any other URL with the tenant's default secret.

NOTE: during a rotation window an endpoint has two secrets; both sign every message (Standard
Webhooks: several space-separated signatures), so receivers verify with either.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from control_plane.db.models import Tenant, WebhookEndpoint
from control_plane.domain.clock import iso
from control_plane.domain.ids import new_id
from control_plane.errors import Conflict, NotFound
from control_plane.services.tenants.api_keys import new_webhook_secret


def create(session: Session, tenant_id: str, url: str, now: datetime) -> WebhookEndpoint:
    """Register `url` (already checked as a target) with a fresh secret; 409 when it exists."""
    if for_url(session, tenant_id, url) is not None:
        raise Conflict(f"an endpoint for {url!r} already exists")
    ep = WebhookEndpoint(
        id=new_id("whe", now), tenant_id=tenant_id, url=url, secret=new_webhook_secret()
    )
    ep.created_at = now
    session.add(ep)
    try:
        session.flush()
    except IntegrityError:
        # A concurrent request registered the same URL (UNIQUE(tenant_id, url)).
        session.rollback()
        raise Conflict(f"an endpoint for {url!r} already exists") from None
    return ep


def get(session: Session, tenant_id: str, endpoint_id: str) -> WebhookEndpoint:
    ep = session.get(WebhookEndpoint, endpoint_id)
    # Another tenant's endpoint is indistinguishable from a missing one.
    if ep is None or ep.tenant_id != tenant_id:
        raise NotFound(f"webhook endpoint '{endpoint_id}' does not exist")
    return ep


def list_(session: Session, tenant_id: str) -> list[WebhookEndpoint]:
    q = select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id)
    return list(session.scalars(q.order_by(WebhookEndpoint.id)))


def delete(session: Session, tenant_id: str, endpoint_id: str) -> None:
    session.delete(get(session, tenant_id, endpoint_id))


def rotate(
    session: Session, tenant_id: str, endpoint_id: str, now: datetime, overlap_s: float
) -> WebhookEndpoint:
    """New secret; the current one keeps signing for `overlap_s` (an older previous is dropped)."""
    ep = get(session, tenant_id, endpoint_id)
    ep.previous_secret = ep.secret
    ep.previous_expires_at = now + timedelta(seconds=overlap_s)
    ep.secret = new_webhook_secret()
    return ep


def rotate_default(session: Session, tenant_id: str, now: datetime, overlap_s: float) -> Tenant:
    """New default secret (URLs without an endpoint); the current one signs too for
    `overlap_s`, an older previous one is dropped."""
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"tenant '{tenant_id}' does not exist")
    tenant.previous_webhook_secret = tenant.webhook_secret
    tenant.previous_webhook_secret_expires_at = now + timedelta(seconds=overlap_s)
    tenant.webhook_secret = new_webhook_secret()
    return tenant


def default_secret_to_public(tenant: Tenant, now: datetime) -> dict[str, Any]:
    expires = tenant.previous_webhook_secret_expires_at
    return {
        "secret": tenant.webhook_secret,
        "previous_secret_expires_at": iso(expires) if expires and expires > now else None,
    }


def for_url(session: Session, tenant_id: str, url: str) -> WebhookEndpoint | None:
    return session.scalars(
        select(WebhookEndpoint).where(
            WebhookEndpoint.tenant_id == tenant_id, WebhookEndpoint.url == url
        )
    ).first()


def signing_secrets(
    session: Session, tenant_id: str, url: str, now: datetime
) -> tuple[list[str], WebhookEndpoint | None]:
    """Secrets that sign a message to `url` (newest first), and the endpoint, if one matches."""
    ep = for_url(session, tenant_id, url)
    if ep is not None:
        return _signing(ep.secret, ep.previous_secret, ep.previous_expires_at, now), ep
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"tenant '{tenant_id}' does not exist")
    previous, expires = tenant.previous_webhook_secret, tenant.previous_webhook_secret_expires_at
    return _signing(tenant.webhook_secret, previous, expires, now), None


def _signing(
    secret: str, previous: str | None, expires: datetime | None, now: datetime
) -> list[str]:
    """The current secret, then the previous one while its rotation overlap lasts."""
    return [secret, previous] if previous and expires and expires > now else [secret]


def disable(ep: WebhookEndpoint, reason: str, now: datetime) -> None:
    if ep.disabled_at is None:
        ep.disabled_at = now
        ep.disabled_reason = reason[:200]


def to_public(ep: WebhookEndpoint, *, with_secret: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": ep.id,
        "url": ep.url,
        "created_at": iso(ep.created_at),
        "disabled_at": iso(ep.disabled_at),
        "disabled_reason": ep.disabled_reason,
        "previous_secret_expires_at": iso(ep.previous_expires_at),
    }
    if with_secret:
        out["secret"] = ep.secret
    return out

"""Webhooks: Standard Webhooks signing, SSRF checks, and one delivery attempt.

Retries and scheduling live in the Celery task (`control_plane/tasks.py`); this module only
knows how to sign, check a target and send once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx

from control_plane.errors import InvalidRequest

WEBHOOK_EVENTS = frozenset({"started", "output", "completed"})


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` with a `whsec_` secret."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(secrets: list[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """Space-separated signatures, one per active secret (rotation)."""
    return " ".join(sign(s, msg_id, timestamp, body) for s in secrets)


def check_target(url: str, allow_private: bool) -> None:
    """Refuse non-HTTP URLs and, unless allowed, hosts resolving to non-public addresses."""
    parsed = urlparse(url)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        raise InvalidRequest(
            "webhook must be an http(s) URL with a host",
            errors=[{"field": "webhook", "message": "expected http:// or https:// URL"}],
        )
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(parsed.hostname, parsed.port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise InvalidRequest(f"webhook host {parsed.hostname!r} does not resolve") from exc
    for info in infos:
        addr = ipaddress.ip_address(info[4][0])
        if not addr.is_global:
            raise InvalidRequest(
                f"webhook host {parsed.hostname!r} resolves to a non-public address ({addr}); "
                "private, loopback and link-local targets are refused by this platform",
                errors=[{"field": "webhook", "message": "non-public address"}],
            )


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    status_code: int | None  # HTTP status, None when no response came
    error: str | None  # transport error, if any
    ok: bool  # 2xx
    gone: bool  # 410: the receiver asks us to stop sending


def payload(event_type: str, timestamp: int, data: dict[str, Any]) -> bytes:
    return json.dumps(
        {"type": event_type, "timestamp": timestamp, "data": data}, separators=(",", ":")
    ).encode()


def send_once(
    client: httpx.Client, url: str, secret: str, msg_id: str, timestamp: int, body: bytes
) -> DeliveryResult:
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header([secret], msg_id, timestamp, body),
    }
    try:
        resp = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return DeliveryResult(None, f"{type(exc).__name__}: {exc}", ok=False, gone=False)
    return DeliveryResult(
        resp.status_code, None, ok=200 <= resp.status_code < 300, gone=resp.status_code == 410
    )

"""Verify (and, for tests and tools, sign) webhooks the platform sends, per Standard Webhooks.

A delivery carries three headers:
    webhook-id:        msg_...                     (the same on every retry of one event)
    webhook-timestamp: 1700000000                  (Unix seconds when it was signed)
    webhook-signature: v1,<base64 sig> [v1,...]    (several while the secret rotates)
where sig = HMAC-SHA256(key, f"{id}.{timestamp}.{body}") and the secret is
"whsec_" + base64(key). Get the secret with `client.webhooks.secret()`.

Example (any web framework; pass the raw body bytes, not re-encoded JSON):
    from sdk.webhooks import verify, WebhookVerificationError

    try:
        event = verify(request.body, request.headers, secret)
    except WebhookVerificationError:
        return 400
    if event["type"] == "job.completed":
        job = event["data"]

Standalone on purpose: stdlib only, nothing of the platform's server code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sdk._errors import WebhookVerificationError

__all__ = ["WebhookVerificationError", "sign", "verify"]

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"


def sign(payload: bytes | str, secret: str, msg_id: str, timestamp: int | datetime) -> str:
    """The `webhook-signature` header value for `payload` ("v1,<base64>")."""
    mac = _mac(_key(secret), msg_id, _unix_seconds(timestamp), payload)
    return f"{SIGNATURE_VERSION},{base64.b64encode(mac).decode()}"


def verify(
    payload: bytes | str,
    headers: Mapping[str, str],
    secret: str,
    *,
    tolerance_s: float = 300,
    now: float | datetime | None = None,
) -> dict[str, Any]:
    """Check a delivery's signature and timestamp; return its JSON body.

    Passes when any one `v1` signature matches (secret rotation). Raises
    WebhookVerificationError on a missing header, no matching signature, or a timestamp more
    than `tolerance_s` seconds from `now` (default: the current time) either way, which
    bounds replays. A malformed `secret` is a configuration mistake: ValueError.
    """
    key = _key(secret)
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get("webhook-id")
    timestamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature header"
        )
    try:
        sent_s = int(timestamp.strip())
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    now_s = time.time() if now is None else _unix_float(now)
    if sent_s < now_s - tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is too old")
    if sent_s > now_s + tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is in the future")

    expected = _mac(key, msg_id, sent_s, payload)
    matched = False
    for entry in signatures.split():
        version, _, encoded = entry.partition(",")
        if version != SIGNATURE_VERSION:
            continue  # other schemes (e.g. v1a, asymmetric) are not ours to check
        try:
            candidate = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        # NOTE: compare_digest is constant-time; no early exit leaks which entry matched.
        matched = hmac.compare_digest(expected, candidate) or matched
    if not matched:
        raise WebhookVerificationError("no matching webhook signature")

    try:
        body = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WebhookVerificationError("the webhook payload is not JSON") from None
    if not isinstance(body, dict):
        raise WebhookVerificationError("the webhook payload is not a JSON object")
    return body


def _key(secret: str) -> bytes:
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        # Tolerate unpadded base64, as the reference implementation does.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def _mac(key: bytes, msg_id: str, timestamp_s: int, payload: bytes | str) -> bytes:
    body = payload.encode() if isinstance(payload, str) else payload
    return hmac.new(key, f"{msg_id}.{timestamp_s}.".encode() + body, hashlib.sha256).digest()


def _unix_seconds(value: int | datetime) -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("pass an aware datetime (e.g. datetime.now(timezone.utc))")
        return int(value.timestamp())
    return int(value)


def _unix_float(value: float | datetime) -> float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("pass an aware datetime (e.g. datetime.now(timezone.utc))")
        return value.timestamp()
    return float(value)

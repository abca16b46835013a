"""Standard Webhooks: message ids, signatures, payloads, and one delivery attempt.

Where a webhook may be sent is `targets.py`; retries and the delivery log `delivery.py`; a
tenant's endpoints and secrets `endpoints.py`. This module only knows how to sign and send once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

import httpx

# Events a job's `webhook_events` may ask for; the webhook type is `job.<event>`.
WEBHOOK_EVENTS = frozenset({"starting", "started", "output", "completed"})


def message_id(subject_id: str, event: str, *parts: str | int) -> str:
    """The Standard Webhooks `webhook-id` of one event of a job or batch, the same wherever it
    is sent from: `msg_<subject>_<event>[_<part>...]`. An event that happens once per subject
    (`completed`) needs no part; `starting` is per attempt and phase; `started` per attempt;
    `output` per attempt and sequence; a redelivery is a new message (a fresh random part).
    Repeats of one id are delivered once."""
    return "_".join(["msg", subject_id, event, *(str(p) for p in parts)])


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` with a `whsec_` secret."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(secrets: list[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """Space-separated signatures, one per active secret (rotation)."""
    return " ".join(sign(s, msg_id, timestamp, body) for s in secrets)


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    status_code: int | None  # HTTP status, None when no response came
    error: str | None  # transport error or refusal, if any
    ok: bool  # 2xx
    gone: bool  # 410: the receiver asks us to stop sending
    permanent: bool = False  # no retry can succeed (refused target, 410)


def payload(event_type: str, timestamp: int, data: dict[str, Any]) -> bytes:
    return json.dumps(
        {"type": event_type, "timestamp": timestamp, "data": data}, separators=(",", ":")
    ).encode()


def send_once(
    client: httpx.Client,
    url: str,
    secrets: list[str],
    msg_id: str,
    timestamp: int,
    body: bytes,
) -> DeliveryResult:
    """POST one signed message (one signature per secret); never raises for transport errors."""
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(secrets, msg_id, timestamp, body),
    }
    try:
        resp = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return DeliveryResult(None, f"{type(exc).__name__}: {exc}", ok=False, gone=False)
    gone = resp.status_code == 410
    return DeliveryResult(
        resp.status_code, None, ok=200 <= resp.status_code < 300, gone=gone, permanent=gone
    )

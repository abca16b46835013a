"""Webhooks: Standard Webhooks signing, SSRF checks, payloads, and one delivery attempt.

Retries, endpoints and the delivery log live in `webhook_delivery.py` and
`webhook_endpoints.py`; this module only knows how to sign, check a target and send once.
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
class TargetProblem:
    reason: str  # what is wrong with the target, for the API error or the delivery log
    permanent: bool  # True: never send there; False: may change (DNS did not answer)


def target_problem(url: str, allow_private: bool) -> TargetProblem | None:
    """Why a webhook may not be sent to `url` now (None: it may).

    Refuses non-HTTP URLs and, unless allowed, hosts resolving to non-public addresses. Called
    when a URL is accepted and again before every delivery, since DNS answers can change.
    """
    parsed = urlparse(url)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        return TargetProblem("webhook must be an http(s) URL with a host", permanent=True)
    if allow_private:
        return None
    try:
        infos = socket.getaddrinfo(parsed.hostname, parsed.port or 443, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return TargetProblem(f"webhook host {parsed.hostname!r} does not resolve", permanent=False)
    for info in infos:
        addr = ipaddress.ip_address(info[4][0])
        if not addr.is_global:
            return TargetProblem(
                f"webhook host {parsed.hostname!r} resolves to a non-public address ({addr}); "
                "private, loopback and link-local targets are refused by this platform",
                permanent=True,
            )
    return None


def check_target(url: str, allow_private: bool, field: str = "webhook") -> None:
    """Raise InvalidRequest (naming `field`) when `url` is not an acceptable webhook target."""
    problem = target_problem(url, allow_private)
    if problem is not None:
        raise InvalidRequest(problem.reason, errors=[{"field": field, "message": problem.reason}])


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

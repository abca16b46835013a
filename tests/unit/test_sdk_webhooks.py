"""sdk.webhooks: Standard Webhooks signing and verification, cross-checked with the reference."""

from __future__ import annotations

import base64
import json
import secrets
from datetime import UTC, datetime

import pytest
import standardwebhooks

from sdk import WebhookVerificationError as ExportedError
from sdk.webhooks import WebhookVerificationError, sign, verify

NOW = 1_700_000_000
BODY = json.dumps({"type": "job.completed", "timestamp": NOW, "data": {"id": "job_1"}})


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


SECRET = new_secret()


def headers(signature: str, msg_id: str = "msg_1", timestamp: int = NOW) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }


def test_sign_then_verify_round_trip() -> None:
    signature = sign(BODY, SECRET, "msg_1", NOW)
    assert signature.startswith("v1,")
    assert verify(BODY.encode(), headers(signature), SECRET, now=NOW) == json.loads(BODY)
    assert verify(BODY, headers(signature), SECRET, now=NOW)["data"] == {"id": "job_1"}


def test_header_names_are_case_insensitive() -> None:
    signed = headers(sign(BODY, SECRET, "msg_1", NOW))
    upper = {k.title(): v for k, v in signed.items()}
    assert verify(BODY, upper, SECRET, now=NOW)["type"] == "job.completed"


def test_any_one_matching_signature_passes_during_rotation() -> None:
    old, new = new_secret(), new_secret()
    both = f"{sign(BODY, old, 'msg_1', NOW)} {sign(BODY, new, 'msg_1', NOW)}"
    assert verify(BODY, headers(both), old, now=NOW)
    assert verify(BODY, headers(both), new, now=NOW)
    with pytest.raises(WebhookVerificationError, match="no matching"):
        verify(BODY, headers(both), new_secret(), now=NOW)


def test_other_versions_and_garbage_entries_are_skipped() -> None:
    good = sign(BODY, SECRET, "msg_1", NOW)
    noisy = f"v1a,abcd v1,!!!notbase64 {good}"
    assert verify(BODY, headers(noisy), SECRET, now=NOW)
    with pytest.raises(WebhookVerificationError):
        verify(BODY, headers(good.replace("v1,", "v2,")), SECRET, now=NOW)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"body": BODY.replace("job_1", "job_2")}, "no matching"),
        ({"msg_id": "msg_2"}, "no matching"),
        ({"timestamp": NOW - 301}, "too old"),
        ({"timestamp": NOW + 301}, "in the future"),
    ],
)
def test_tampering_and_stale_timestamps_fail(change: dict[str, object], message: str) -> None:
    timestamp = int(str(change.get("timestamp", NOW)))
    signature = sign(BODY, SECRET, "msg_1", timestamp)
    sent = headers(signature, str(change.get("msg_id", "msg_1")), timestamp)
    with pytest.raises(WebhookVerificationError, match=message):
        verify(str(change.get("body", BODY)), sent, SECRET, now=NOW)


def test_tolerance_is_configurable_and_inclusive() -> None:
    signature = sign(BODY, SECRET, "msg_1", NOW - 300)
    assert verify(BODY, headers(signature, timestamp=NOW - 300), SECRET, now=NOW)
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(BODY, headers(signature, timestamp=NOW - 300), SECRET, now=NOW, tolerance_s=60)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_headers_fail(missing: str) -> None:
    sent = headers(sign(BODY, SECRET, "msg_1", NOW))
    del sent[missing]
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify(BODY, sent, SECRET, now=NOW)


def test_bad_timestamp_and_non_object_payload_fail() -> None:
    sent = headers(sign(BODY, SECRET, "msg_1", NOW))
    sent["webhook-timestamp"] = "yesterday"
    with pytest.raises(WebhookVerificationError, match="integer"):
        verify(BODY, sent, SECRET, now=NOW)
    with pytest.raises(WebhookVerificationError, match="JSON object"):
        verify("[1]", headers(sign("[1]", SECRET, "msg_1", NOW)), SECRET, now=NOW)


def test_a_malformed_secret_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="whsec_"):
        sign(BODY, "whsec_***", "msg_1", NOW)
    with pytest.raises(ValueError, match="empty"):
        sign(BODY, "whsec_", "msg_1", NOW)


def test_the_error_is_part_of_the_sdk_tree() -> None:
    assert WebhookVerificationError is ExportedError


# --- cross-checks with the reference implementation (the `standardwebhooks` package) -------


def test_reference_signatures_verify_with_ours() -> None:
    now = datetime.now(UTC)
    reference = standardwebhooks.Webhook(SECRET)
    signature = reference.sign("msg_ref", now, BODY)
    sent = headers(signature, "msg_ref", int(now.timestamp()))
    assert verify(BODY, sent, SECRET) == json.loads(BODY)
    assert sign(BODY, SECRET, "msg_ref", now) == signature


def test_our_signatures_verify_with_the_reference() -> None:
    now = datetime.now(UTC)
    signature = sign(BODY.encode(), SECRET, "msg_ours", now)
    sent = headers(signature, "msg_ours", int(now.timestamp()))
    assert standardwebhooks.Webhook(SECRET).verify(BODY, sent) == json.loads(BODY)

    tampered = headers(signature, "msg_ours", int(now.timestamp()))
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(BODY + " ", tampered)


def test_unpadded_secrets_match_the_reference() -> None:
    unpadded = "whsec_" + base64.b64encode(b"k" * 31).decode().rstrip("=")
    now = datetime.now(UTC)
    assert sign(BODY, unpadded, "m", now) == standardwebhooks.Webhook(unpadded).sign("m", now, BODY)

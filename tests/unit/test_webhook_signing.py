"""Control-plane webhook signing, checked against the reference `standardwebhooks` package."""

import base64
import json
import secrets
import time

import pytest
from standardwebhooks import Webhook

from control_plane.errors import InvalidRequest
from control_plane.services.webhooks import signing, targets


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def test_signature_verifies_with_standardwebhooks() -> None:
    secret = new_secret()
    ts = int(time.time())
    body = signing.payload("job.completed", ts, {"id": "job_1", "status": "succeeded"})
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(ts),
        "webhook-signature": signing.signature_header([secret], "msg_1", ts, body),
    }
    assert Webhook(secret).verify(body, headers)["data"]["id"] == "job_1"


def test_rotation_sends_one_signature_per_secret() -> None:
    old, new = new_secret(), new_secret()
    ts = int(time.time())
    body = json.dumps({"x": 1}).encode()
    header = signing.signature_header([old, new], "msg_2", ts, body)
    assert len(header.split(" ")) == 2
    for s in (old, new):
        Webhook(s).verify(
            body, {"webhook-id": "msg_2", "webhook-timestamp": str(ts), "webhook-signature": header}
        )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://localhost:8080/x",
        "http://10.1.2.3/x",
        "http://192.168.0.1/",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x",
        "ftp://example.com/x",
        "nohost",
    ],
)
def test_non_public_targets_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequest):
        targets.check_target(url, allow_private=False)


def test_private_targets_allowed_by_configuration() -> None:
    targets.check_target("http://127.0.0.1:9/x", allow_private=True)
    with pytest.raises(InvalidRequest):
        targets.check_target("file:///etc/passwd", allow_private=True)


def test_target_problem_tells_permanent_from_transient() -> None:
    refused = targets.target_problem("http://10.0.0.1/x", allow_private=False)
    assert refused is not None and refused.permanent and "non-public" in refused.reason
    unresolvable = targets.target_problem("http://no-such-host.invalid/x", allow_private=False)
    assert unresolvable is not None and not unresolvable.permanent
    assert targets.target_problem("http://127.0.0.1/x", allow_private=True) is None
    bad = targets.target_problem("gopher://example.com/", allow_private=True)
    assert bad is not None and bad.permanent


def test_check_target_names_the_field() -> None:
    with pytest.raises(InvalidRequest) as info:
        targets.check_target("http://127.0.0.1/x", allow_private=False, field="url")
    assert info.value.extra["errors"][0]["field"] == "url"

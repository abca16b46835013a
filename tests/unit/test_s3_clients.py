"""The control plane's S3 clients are kept per credentials, endpoint, region, timeouts and
environment (`storage.s3_client`): building one costs ~60 ms and ~35k objects in cycles.
Building a client sends nothing, so these run without a server."""

from __future__ import annotations

import gc

import pytest

from common import heap
from control_plane.domain import uris
from control_plane.services.storage import storage_access


def access(
    key_pair: tuple[str, str] | None = None, endpoint: str = "http://127.0.0.1:9"
) -> storage_access.Access:
    location = uris.Location("s3", "bucket", "key")
    return storage_access.Access(
        location, "s3://bucket/key", endpoint, "us-east-1", key_pair, False
    )


def access_key(client: object) -> str:
    return client._request_signer._credentials.access_key  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def platform_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "platform-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "platform-secret")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def test_the_same_access_gets_the_same_client() -> None:
    assert storage_access.s3_client(access()) is storage_access.s3_client(access())
    probe = storage_access.s3_client(access(), timeout_s=2)
    assert probe is storage_access.s3_client(access(), timeout_s=2)
    assert probe is not storage_access.s3_client(access())  # other timeouts and retries


def test_each_key_pair_gets_a_client_signing_with_it() -> None:
    a = storage_access.s3_client(access(("tenant-a-key", "a-secret")))
    b = storage_access.s3_client(access(("tenant-b-key", "b-secret")))
    own = storage_access.s3_client(access())
    assert (access_key(a), access_key(b), access_key(own)) == (
        "tenant-a-key",
        "tenant-b-key",
        "platform-key",
    )
    # the same key id with another secret (a registration replaced) is another client
    assert storage_access.s3_client(access(("tenant-a-key", "new-secret"))) is not a


def test_a_changed_environment_or_endpoint_gets_a_new_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = storage_access.s3_client(access())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rotated-key")
    after = storage_access.s3_client(access())
    assert after is not before and access_key(after) == "rotated-key"
    other = storage_access.s3_client(access(endpoint="http://127.0.0.1:10"))
    assert other is not after and other.meta.endpoint_url == "http://127.0.0.1:10"


def test_settle_freezes_what_exists_and_sets_the_thresholds() -> None:
    thresholds = gc.get_threshold()
    kept = [object() for _ in range(10)]
    try:
        heap.settle(threshold=(5000, 20, 30))
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (5000, 20, 30)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)

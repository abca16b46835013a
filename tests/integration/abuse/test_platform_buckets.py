"""A tenant cannot register storage credentials for a bucket the platform itself uses: its
store, its batch results, and the buckets the embedded platform's own S3 server creates
(`models`). 422 naming the bucket, nothing stored."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from control_plane.embedded.processes import EMBEDDED_BUCKETS
from control_plane.embedded.supervisor import reserve_store_buckets
from control_plane.settings import Settings
from tests.integration.abuse.conftest import RESULTS_BUCKET, STORE_BUCKET, Rows
from tests.integration.api_helpers import h


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """As the embedded platform runs: its store's own buckets reserved."""
    return settings.model_copy(update={"reserved_buckets": EMBEDDED_BUCKETS})


@pytest.mark.parametrize("bucket", [STORE_BUCKET, RESULTS_BUCKET, *EMBEDDED_BUCKETS])
def test_the_platforms_buckets_cannot_be_registered(
    client: TestClient, keys: dict[str, str], rows: Rows, settings: Settings, bucket: str
) -> None:
    before = rows.counts()
    body = {"bucket": bucket, "access_key_id": "AKIA1", "secret_access_key": "s"}
    for endpoint in (None, settings.s3_endpoint_url):
        r = client.post(
            "/v1/storage-credentials", json={**body, "endpoint_url": endpoint}, headers=h(keys["b"])
        )
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["errors"][0]["field"] == "bucket"
        assert f"bucket '{bucket}': is the platform's own bucket" in problem["detail"]
    assert rows.counts() == before
    body["bucket"] = "tenant-own"  # any other bucket still can
    r = client.post("/v1/storage-credentials", json=body, headers=h(keys["b"]))
    assert r.status_code == 201, r.text


def test_the_embedded_platform_reserves_its_stores_buckets() -> None:
    env = {"PLATFORM_RESERVED_BUCKETS": '["archive"]'}
    reserve_store_buckets(env)
    assert set(json.loads(env["PLATFORM_RESERVED_BUCKETS"])) == {"archive", *EMBEDDED_BUCKETS}
    # and the API processes read it as the setting
    settings = Settings(reserved_buckets=json.loads(env["PLATFORM_RESERVED_BUCKETS"]))
    assert set(settings.reserved_buckets) >= set(EMBEDDED_BUCKETS)
    fresh: dict[str, str] = {}
    reserve_store_buckets(fresh)
    assert json.loads(fresh["PLATFORM_RESERVED_BUCKETS"]) == list(EMBEDDED_BUCKETS)

"""Tenant-scoped storage against the real API, SQL, Redis and S3 server (rclone): a tenant
reads its own namespace and the buckets it registered, nothing else; traversal is refused;
missing and forbidden objects answer alike; workers get their deployment's credentials only.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from bench.reconciler_tick import RecordingProvider
from control_plane.api.app import create_app
from control_plane.db.models import Deployment, StorageCredential
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.providers.local import worker_env
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.env import Env
from control_plane.services.jobs.dispatch import make_celery
from control_plane.services.storage import files
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import h, on_s3

STORE = "store-tenancy"
UPLOAD_LIMIT = 12 * 1024 * 1024


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    # Tenancy of URIs, not checkpoints: the deployed models are not uploaded here (the
    # integration settings do not validate them).
    return on_s3(
        settings,
        s3_env,
        store_bucket=STORE,
        results_bucket="results-tenancy",
        upload_max_bytes=UPLOAD_LIMIT,
    )


def put(client: TestClient, key: str, path: str, data: bytes) -> httpx.Response:
    return client.put(f"/v1/files/{path}", content=data, headers=h(key))


def deploy(client: TestClient, key: str, model: str) -> httpx.Response:
    return client.post("/v1/deployments", json={"name": "m", "model": model}, headers=h(key))


def batch(client: TestClient, key: str, uri: str) -> httpx.Response:
    return client.post("/v1/batches", json={"deployment": "m", "input_uri": uri}, headers=h(key))


def count_deployments(settings: Settings) -> int:
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as s:
        n = len(list(s.scalars(select(Deployment))))
    engine.dispose()
    return n


def test_a_tenant_reads_its_own_namespace_and_nobody_elses(
    client: TestClient, tenants: dict[str, Any], settings: Settings
) -> None:
    a, b = tenants["a"], tenants["b"]
    up = put(client, a["key"], "in/batch.jsonl", b'{"prompt": "x"}\n')
    assert up.status_code == 201, up.text
    assert up.json()["uri"] == "store://in/batch.jsonl" and up.json()["bytes"] == 16
    assert deploy(client, a["key"], "store://models/demo/").status_code == 201
    assert batch(client, a["key"], "store://in/batch.jsonl").status_code == 201

    # B names the same path: that is B's namespace, where nothing was uploaded.
    assert deploy(client, b["key"], "store://models/demo/").status_code == 201
    missing = batch(client, b["key"], "store://in/batch.jsonl")
    assert missing.status_code == 422
    assert "does not exist or is not readable" in missing.json()["detail"]
    # B spells A's object in the platform's bucket: refused on the URI alone, and the answer
    # is the same for an object that exists and one that does not.
    there = batch(client, b["key"], f"s3://{STORE}/tenants/{a['id']}/in/batch.jsonl")
    absent = batch(client, b["key"], f"s3://{STORE}/tenants/{a['id']}/in/nothing.jsonl")
    assert there.status_code == absent.status_code == 422
    assert there.json()["errors"][0]["message"] == absent.json()["errors"][0]["message"]
    # B's listing shows none of A's files.
    listed = client.get("/v1/files", headers=h(b["key"])).json()
    assert listed == {"data": [], "next_cursor": None}
    assert [f["path"] for f in client.get("/v1/files", headers=h(a["key"])).json()["data"]] == [
        "in/batch.jsonl"
    ]
    # B cannot delete A's file through its own namespace either.
    assert client.delete("/v1/files/in/batch.jsonl", headers=h(b["key"])).status_code == 404
    assert client.delete("/v1/files/in/batch.jsonl", headers=h(a["key"])).status_code == 204
    assert client.get("/v1/files", headers=h(a["key"])).json()["data"] == []


@pytest.mark.parametrize(
    "model",
    [
        "store://../x/",
        "store://a/%2e%2e/b/",
        "store://a/..%2fb/",
        "store://a//b/",
        "s3://bkt/a/../../b/",
        "file:///etc/../etc/",
        "gs://bucket/x/",
    ],
)
def test_traversal_is_422_and_creates_nothing(
    client: TestClient, tenants: dict[str, Any], settings: Settings, model: str
) -> None:
    r = deploy(client, tenants["a"]["key"], model)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "model"
    assert count_deployments(settings) == 0
    upload = put(client, tenants["a"]["key"], "a/%2e%2e/b", b"x")
    assert upload.status_code in (404, 422)  # 404 when the client normalised the path away
    assert client.get("/v1/files", headers=h(tenants["a"]["key"])).json()["data"] == []


def test_host_paths_only_for_the_operator_with_the_setting(
    client: TestClient, tenants: dict[str, Any], settings: Settings, database_url: str,
    redis_url: str, redis_client: Any,
) -> None:  # fmt: skip
    # An existing and a missing path answer alike; nothing about the host leaks.
    for who in ("a", "op"):
        exists = deploy(client, tenants[who]["key"], "file:///etc/")
        absent = deploy(client, tenants[who]["key"], "file:///no/such/dir/")
        assert exists.status_code == absent.status_code == 422
        assert exists.json()["errors"] == absent.json()["errors"]
    allowed = Settings(**{**settings.model_dump(), "allow_host_paths": True})
    with TestClient(create_app(allowed)) as c:
        assert deploy(c, tenants["a"]["key"], "file:///etc/").status_code == 422
        assert deploy(c, tenants["op"]["key"], "file:///srv/models/x/").status_code == 201


def test_registered_credentials_read_a_bucket_and_are_never_returned(
    client: TestClient, tenants: dict[str, Any], settings: Settings, s3_env: S3Server
) -> None:
    a, b = tenants["a"], tenants["b"]
    from control_plane.services.storage import object_store

    object_store.client(settings).put_object(
        Bucket="test", Key="ext/batch.jsonl", Body=b'{"prompt": "x"}\n'
    )
    assert deploy(client, a["key"], "store://m/").status_code == 201
    assert batch(client, a["key"], "s3://test/ext/batch.jsonl").status_code == 422  # not yet

    body = {"bucket": "test", "access_key_id": s3_env.access_key,
            "secret_access_key": s3_env.secret_key}  # fmt: skip
    made = client.post("/v1/storage-credentials", json=body, headers=h(a["key"]))
    assert made.status_code == 201, made.text
    assert s3_env.secret_key not in made.text and s3_env.access_key not in made.text
    listed = client.get("/v1/storage-credentials", headers=h(a["key"]))
    assert s3_env.secret_key not in listed.text
    assert [c["bucket"] for c in listed.json()["data"]] == ["test"]
    assert client.get("/v1/storage-credentials", headers=h(b["key"])).json()["data"] == []
    # stored encrypted
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as s:
        row = s.scalars(select(StorageCredential)).one()
        assert s3_env.secret_key not in row.secret_ciphertext
    engine.dispose()

    assert batch(client, a["key"], "s3://test/ext/batch.jsonl").status_code == 201
    # A's registration is A's: B still cannot read the bucket.
    assert deploy(client, b["key"], "store://m/").status_code == 201
    assert batch(client, b["key"], "s3://test/ext/batch.jsonl").status_code == 422
    # A second registration for the bucket conflicts; deleting frees it.
    assert client.post("/v1/storage-credentials", json=body, headers=h(a["key"])).status_code == 409
    cid = made.json()["id"]
    assert client.delete(f"/v1/storage-credentials/{cid}", headers=h(b["key"])).status_code == 404
    assert client.delete(f"/v1/storage-credentials/{cid}", headers=h(a["key"])).status_code == 204

    # Wrong keys: a real object and a missing one answer alike.
    wrong = {**body, "secret_access_key": "not-the-secret"}
    assert (
        client.post("/v1/storage-credentials", json=wrong, headers=h(a["key"])).status_code == 201
    )
    real = batch(client, a["key"], "s3://test/ext/batch.jsonl")
    absent = batch(client, a["key"], "s3://test/ext/none.jsonl")
    assert real.status_code == absent.status_code == 422
    assert real.json()["errors"] == absent.json()["errors"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"bucket": STORE}, "bucket"),
        ({"bucket": "results-tenancy"}, "bucket"),
        ({"bucket": "Not_A_Bucket"}, "bucket"),
        ({"bucket": "ext", "endpoint_url": "http://169.254.169.254/"}, "endpoint_url"),
        ({"bucket": "ext", "region": "evil.example.com/#"}, "region"),
    ],
)
def test_bad_credential_registrations_are_422(
    client: TestClient, tenants: dict[str, Any], body: dict[str, Any], field: str
) -> None:
    full = {"access_key_id": "AK", "secret_access_key": "s", **body}
    r = client.post("/v1/storage-credentials", json=full, headers=h(tenants["a"]["key"]))
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == field


def test_uploads_stream_in_parts_and_oversize_leaves_nothing(
    client: TestClient, tenants: dict[str, Any], settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(files, "PART_BYTES", 5 * 1024 * 1024)
    key = tenants["a"]["key"]
    data = bytes(range(256)) * (11 * 1024 * 1024 // 256)  # 3 parts
    r = put(client, key, "big/model.safetensors", data)
    assert r.status_code == 201, r.text
    assert r.json()["bytes"] == len(data)
    from control_plane.services.storage import object_store

    got = (
        object_store.client(settings)
        .get_object(Bucket=STORE, Key=f"tenants/{tenants['a']['id']}/big/model.safetensors")["Body"]
        .read()
    )
    assert got == data

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length to refuse it up front
        for _ in range(13):
            yield b"\0" * (1024 * 1024)

    over = client.put("/v1/files/big/over.bin", content=chunks(), headers=h(key))
    assert over.status_code == 413, over.text
    assert over.json()["limit_bytes"] == UPLOAD_LIMIT
    paths = [f["path"] for f in client.get("/v1/files", headers=h(key)).json()["data"]]
    assert paths == ["big/model.safetensors"]
    # an unknown key uploads nothing
    assert put(client, "pk_bad", "x", b"x").status_code == 401


def test_workers_get_their_deployments_credentials_only(
    client: TestClient, tenants: dict[str, Any], settings: Settings, s3_env: S3Server,
    redis_url: str,
) -> None:  # fmt: skip
    a = tenants["a"]
    body = {"bucket": "test", "access_key_id": "AKTENANT", "secret_access_key": "tenant-secret"}
    assert client.post("/v1/storage-credentials", json=body, headers=h(a["key"])).status_code == 201
    spec = {"name": "ext", "model": "s3://test/ckpt/", "min_workers": 1}
    assert client.post("/v1/deployments", json=spec, headers=h(a["key"])).status_code == 201
    spec = {"name": "own", "model": "store://models/x/", "min_workers": 1}
    assert client.post("/v1/deployments", json=spec, headers=h(a["key"])).status_code == 201

    provider = RecordingProvider()
    env = Env(settings, redis.Redis.from_url(redis_url), make_celery(settings), provider)
    Reconciler(env, make_sessionmaker(make_engine(settings.database_url))).tick(datetime.now(UTC))
    started = {x.model_uri: x.storage_env for s in provider.started if (x := s.assignment)}
    ext = started["s3://test/ckpt/"]
    assert (ext["AWS_ACCESS_KEY_ID"], ext["AWS_SECRET_ACCESS_KEY"]) == ("AKTENANT", "tenant-secret")
    own = started[f"s3://{STORE}/tenants/{a['id']}/models/x/"]
    assert own["AWS_ACCESS_KEY_ID"] == s3_env.access_key  # the platform's, on a fixed prefix
    assert own["AWS_ENDPOINT_URL"] == ext["AWS_ENDPOINT_URL"] == s3_env.url
    # The provider's base environment carries no storage credentials at all.
    base = worker_env(s3_env.env() | {"HF_TOKEN": "hf_x", "PATH": "/bin"}, {})
    assert base == {"PATH": "/bin", "PYTHONUNBUFFERED": "1", "AWS_DEFAULT_REGION": "us-east-1"}


def test_workers_reach_the_platforms_endpoint_where_the_operator_says(
    client: TestClient, tenants: dict[str, Any], settings: Settings, s3_env: S3Server,
    redis_url: str,
) -> None:  # fmt: skip
    """PLATFORM_WORKER_S3_ENDPOINT_URL: workers read the platform's endpoint by their own path,
    for the store and for a tenant's bucket on that endpoint alike (the test above: without
    it, they get the control plane's)."""
    a = tenants["a"]
    body = {"bucket": "test", "access_key_id": "AKTENANT", "secret_access_key": "tenant-secret"}
    assert client.post("/v1/storage-credentials", json=body, headers=h(a["key"])).status_code == 201
    for name, model in (("ext", "s3://test/ckpt/"), ("own", "store://models/x/")):
        spec = {"name": name, "model": model, "min_workers": 1}
        assert client.post("/v1/deployments", json=spec, headers=h(a["key"])).status_code == 201

    node_local = "http://127.0.0.1:1"  # the workers' path; nothing needs to answer there
    own_path = settings.model_copy(update={"worker_s3_endpoint_url": node_local})
    provider = RecordingProvider()
    env = Env(own_path, redis.Redis.from_url(redis_url), make_celery(own_path), provider)
    Reconciler(env, make_sessionmaker(make_engine(own_path.database_url))).tick(datetime.now(UTC))
    started = {x.model_uri: x.storage_env for s in provider.started if (x := s.assignment)}
    assert len(started) == 2
    for storage_env in started.values():
        assert storage_env["AWS_ENDPOINT_URL"] == node_local

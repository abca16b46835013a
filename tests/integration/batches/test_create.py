"""Creating a batch: inputs as a list, JSONL text or an object in storage; bad requests refused
whole (422 naming line and field, nothing written); scopes, unknown deployments, idempotency
keys and tenant isolation."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from control_plane.db.models import Batch, Job
from tests.conftest import S3Server
from tests.integration.api_helpers import deploy, h
from tests.integration.batches.helpers import RESULTS_BUCKET, Db, create


def test_jsonl_text_and_s3_object_inputs(
    client: TestClient, keys: dict[str, str], db: Db, s3_env: S3Server
) -> None:
    deploy(client, keys["a"])
    jsonl = '{"prompt": "a"}\n\n{"prompt": "b", "max_tokens": 3}\n'
    r = create(client, keys["a"], {"input_jsonl": jsonl})
    assert r.status_code == 201, r.text
    assert [j.input["prompt"] for j in db.jobs(r.json()["id"])] == ["a", "b"]
    assert db.jobs(r.json()["id"])[1].input["max_tokens"] == 3

    # A file of the tenant's namespace, uploaded through the API.
    up = client.put("/v1/files/in/batch.jsonl", content=b'{"prompt": "x"}\n{"prompt": "y"}',
                    headers=h(keys["a"]))  # fmt: skip
    assert up.status_code == 201, up.text
    assert up.json()["uri"] == "store://in/batch.jsonl"
    r = create(client, keys["a"], {"input_uri": "store://in/batch.jsonl", "max_in_flight": 1})
    assert r.status_code == 201, r.text
    assert r.json()["input_uri"] == "store://in/batch.jsonl"
    assert [j.input["prompt"] for j in db.jobs(r.json()["id"])] == ["x", "y"]


# (request body, line number named, field named) of requests that must be refused whole.
BAD_BATCHES: list[tuple[dict[str, Any], int | None, str]] = [
    (
        {"inputs": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "max_tokens": 0}]},
        3,
        "max_tokens",
    ),
    ({"inputs": [{"prompt": "a", "bogus": 1}]}, 1, "bogus"),
    ({"inputs": ["just text"]}, 1, "inputs"),
    ({"input_jsonl": '{"prompt": "a"}\n{"prompt": \n'}, 2, "input_jsonl"),
    ({"input_jsonl": '{"prompt": "a"}\n\n{"temperature": 0.5}'}, 3, "prompt"),
    ({"inputs": []}, None, "inputs"),
    ({"inputs": [{"prompt": "a"}], "input_jsonl": "{}"}, None, "body"),
    ({}, None, "body"),
    ({"inputs": [{"prompt": "a"}], "max_in_flight": 0}, None, "max_in_flight"),
    ({"inputs": [{"prompt": "a"}], "max_in_flight": 9}, None, "max_in_flight"),
    ({"inputs": [{"prompt": "a"}] * 51}, None, "inputs"),
    ({"input_uri": "s3://test/missing.jsonl"}, None, "input_uri"),
    ({"input_uri": "file:///etc/passwd"}, None, "input_uri"),
    ({"input_uri": f"s3://{RESULTS_BUCKET}/batches/ten_other/x.jsonl"}, None, "input_uri"),
    ({"inputs": [{"prompt": "a"}], "webhook": "http://127.0.0.1:9/x"}, None, "webhook"),
]


def test_bad_input_is_422_naming_line_and_field_and_writes_nothing(
    client: TestClient, keys: dict[str, str], db: Db
) -> None:
    # One database for all cases (each would otherwise pay for a migration).
    deploy(client, keys["a"])
    for body, line, field in BAD_BATCHES:
        r = create(client, keys["a"], body)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        err = r.json()["errors"][0]
        assert err["field"] == field, (body, r.json())
        if line is not None:
            assert err["line"] == line and f"line {line}" in r.json()["detail"], r.json()
        assert db.count(Batch) == 0 and db.count(Job) == 0, body


def test_auth_scope_and_unknown_deployment(client: TestClient, keys: dict[str, str]) -> None:
    body = {"deployment": "demo", "inputs": [{"prompt": "a"}]}
    assert client.post("/v1/batches", json=body).status_code == 401
    deploy(client, keys["a"])
    r = client.post("/v1/batches", json=body, headers=h(keys["ro"]))
    assert r.status_code == 403 and "run" in r.json()["detail"]
    r = client.post("/v1/batches", json={**body, "deployment": "nope"}, headers=h(keys["a"]))
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    assert client.get("/v1/batches/bat_nothere", headers=h(keys["a"])).status_code == 404


def test_idempotent_creation(client: TestClient, keys: dict[str, str], db: Db) -> None:
    deploy(client, keys["a"])
    body = {"inputs": [{"prompt": "a"}, {"prompt": "b"}]}
    first = create(client, keys["a"], body, **{"Idempotency-Key": "batch-1"})
    again = create(client, keys["a"], body, **{"Idempotency-Key": "batch-1"})
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = create(
        client, keys["a"], {"inputs": [{"prompt": "c"}]}, **{"Idempotency-Key": "batch-1"}
    )
    assert other.status_code == 409
    # The same key from another tenant is another batch.
    deploy(client, keys["b"])
    theirs = create(client, keys["b"], body, **{"Idempotency-Key": "batch-1"})
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    assert db.count(Batch) == 2 and db.count(Job) == 4


def test_tenant_isolation(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    bid = create(client, keys["a"], {"inputs": [{"prompt": "a"}]}).json()["id"]
    for method, path in [
        ("GET", f"/v1/batches/{bid}"),
        ("POST", f"/v1/batches/{bid}/cancel"),
        ("GET", f"/v1/batches/{bid}/results"),
        ("GET", f"/v1/batches/{bid}/webhook/deliveries"),
    ]:
        assert client.request(method, path, headers=h(keys["b"])).status_code == 404, path
    assert client.get("/v1/batches", headers=h(keys["b"])).json()["data"] == []
    # Tenant B cannot run a batch on tenant A's deployment either.
    assert create(client, keys["b"], {"inputs": [{"prompt": "a"}]}).status_code == 404

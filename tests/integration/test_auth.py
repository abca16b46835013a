"""API keys and tenants: created once, stored hashed, scoped, revoked at once; operator only
creates tenants."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.integration.api_helpers import deploy, h


def test_key_is_shown_once_and_works(client: TestClient, keys: dict[str, str]) -> None:
    r = client.post(
        "/v1/keys", json={"name": "ci", "scopes": ["run", "read"]}, headers=h(keys["a"])
    )
    assert r.status_code == 201
    created = r.json()
    assert created["key"].startswith(created["prefix"] + "_")
    listed = client.get("/v1/keys", headers=h(keys["a"])).json()["data"]
    assert created["id"] in [k["id"] for k in listed]
    assert all("key" not in k for k in listed), "secrets are never listed"
    assert client.get("/v1/deployments", headers=h(created["key"])).status_code == 200
    assert (
        client.post(
            "/v1/deployments",
            json={"name": "x", "model": "store://m/x/"},
            headers=h(created["key"]),
        ).status_code
        == 403
    )


def test_revocation_is_immediate(client: TestClient, keys: dict[str, str]) -> None:
    new = client.post("/v1/keys", json={"scopes": ["read"]}, headers=h(keys["a"])).json()
    assert client.get("/v1/jobs", headers=h(new["key"])).status_code == 200
    assert client.delete(f"/v1/keys/{new['id']}", headers=h(keys["a"])).status_code == 204
    assert client.get("/v1/jobs", headers=h(new["key"])).status_code == 401


def test_a_key_reads_its_own_scopes(client: TestClient, keys: dict[str, str]) -> None:
    new = client.post(
        "/v1/keys", json={"name": "ro", "scopes": ["read"]}, headers=h(keys["a"])
    ).json()
    me = client.get("/v1/keys/current", headers=h(new["key"]))
    assert me.status_code == 200, me.text
    assert me.json()["id"] == new["id"] and me.json()["scopes"] == ["read"]
    assert "key" not in me.json(), "never the secret"
    assert client.get("/v1/keys", headers=h(new["key"])).status_code == 403
    client.delete(f"/v1/keys/{new['id']}", headers=h(keys["a"]))
    assert client.get("/v1/keys/current", headers=h(new["key"])).status_code == 401


def test_keys_are_per_tenant(client: TestClient, keys: dict[str, str]) -> None:
    new = client.post("/v1/keys", json={"scopes": ["read"]}, headers=h(keys["a"])).json()
    assert client.delete(f"/v1/keys/{new['id']}", headers=h(keys["b"])).status_code == 404
    assert new["id"] not in [
        k["id"] for k in client.get("/v1/keys", headers=h(keys["b"])).json()["data"]
    ]


def test_bad_scopes_and_guessed_keys(client: TestClient, keys: dict[str, str]) -> None:
    r = client.post("/v1/keys", json={"scopes": ["root"]}, headers=h(keys["a"]))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "scopes"
    prefix = client.post("/v1/keys", json={"scopes": ["read"]}, headers=h(keys["a"])).json()[
        "prefix"
    ]
    assert client.get("/v1/jobs", headers=h(prefix + "_wrongsecret")).status_code == 401


def test_only_the_operator_creates_tenants(client: TestClient, keys: dict[str, str]) -> None:
    assert client.post("/v1/tenants", json={"name": "c"}, headers=h(keys["b"])).status_code == 403
    r = client.post("/v1/tenants", json={"name": "c", "requests_per_min": 10}, headers=h(keys["a"]))
    assert r.status_code == 201
    key_c = r.json()["admin_key"]["key"]
    deploy(client, key_c)
    assert client.get("/v1/deployments", headers=h(keys["a"])).json()["data"] == []
    names = [t["name"] for t in client.get("/v1/tenants", headers=h(keys["a"])).json()["data"]]
    assert "c" in names

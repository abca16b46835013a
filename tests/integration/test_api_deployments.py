"""The API in process (FastAPI TestClient) against a real Redis and a real SQL database:
authentication and scopes (problem+json), a deployment's lifecycle and versions, bad specs named
by field, accelerators the platform does not list, and the served OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.integration.api_helpers import SPEC, deploy, h


def test_auth_is_required_and_problem_json(client: TestClient) -> None:
    r = client.get("/v1/deployments")
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["status"] == 401
    r = client.get("/v1/deployments", headers=h("pk_nothere_secret"))
    assert r.status_code == 401


def test_scopes_are_enforced(client: TestClient, keys: dict[str, str]) -> None:
    r = client.post("/v1/deployments", json=SPEC, headers=h(keys["ro"]))
    assert r.status_code == 403
    assert "deploy" in r.json()["detail"]


def test_deployment_lifecycle(client: TestClient, keys: dict[str, str]) -> None:
    dep = deploy(client, keys["a"])
    assert dep["version"] == 1 and dep["workers"] == {}
    again = client.post("/v1/deployments", json=SPEC, headers=h(keys["a"]))
    assert again.status_code == 409
    upd = client.put("/v1/deployments/demo", json={**SPEC, "max_workers": 2}, headers=h(keys["a"]))
    assert upd.status_code == 200 and upd.json()["version"] == 2
    same = client.put("/v1/deployments/demo", json={**SPEC, "max_workers": 2}, headers=h(keys["a"]))
    assert same.json()["version"] == 2, "an unchanged spec is not a new version"
    assert [
        d["name"] for d in client.get("/v1/deployments", headers=h(keys["a"])).json()["data"]
    ] == ["demo"]
    assert client.delete("/v1/deployments/demo", headers=h(keys["a"])).status_code == 204
    r = client.get("/v1/deployments/demo", headers=h(keys["a"]))
    assert r.status_code == 404 and "demo" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SPEC, "name": "Bad Name"}, "name"),
        ({**SPEC, "model": "ftp://x/y"}, "model"),
        ({**SPEC, "min_workers": 3, "max_workers": 1}, "body"),
        ({**SPEC, "surprise": 1}, "surprise"),
        ({**SPEC, "accelerator": "tpu9"}, "accelerator"),
    ],
)
def test_bad_deployment_specs_name_the_field(
    client: TestClient, keys: dict[str, str], body: dict[str, Any], field: str
) -> None:
    r = client.post("/v1/deployments", json=body, headers=h(keys["a"]))
    assert r.status_code == 422, r.text
    assert any(e["field"] == field for e in r.json()["errors"]), r.json()
    assert client.get("/v1/deployments", headers=h(keys["a"])).json()["data"] == []


def test_a_gpu_type_the_platform_does_not_list_is_refused(
    settings: Settings, redis_client: Any, clock: Any, keys: dict[str, str]
) -> None:
    """Priced, but not among PLATFORM_ACCELERATORS: no node selector or device would place it
    (the kubernetes provider would schedule it on any GPU node)."""
    listed = settings.model_copy(update={"accelerators": {"h100": 8}})
    with TestClient(create_app(listed, clock=clock)) as c:
        r = c.post("/v1/deployments", json={**SPEC, "accelerator": "a100"}, headers=h(keys["a"]))
        assert r.status_code == 422, r.text
        assert r.json()["errors"] == [{"field": "accelerator", "message": "one of ['cpu', 'h100']"}]
        for ok in ("h100", "cpu"):
            body = {**SPEC, "name": f"on-{ok}", "accelerator": ok}
            assert c.post("/v1/deployments", json=body, headers=h(keys["a"])).status_code == 201


def test_openapi_is_served(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "/v1/deployments/{name}/run" in spec["paths"]
    assert not any(p.startswith("/internal") for p in spec["paths"])

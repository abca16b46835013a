"""The per-process cache of what every call reads first (key, deployment, quota limits): two API
instances on one database and one Redis, as two API processes are. A change committed through
one is seen by the other's next request; a cached request reads none of it from SQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.integration.api_helpers import SPEC, deploy, h


@pytest.fixture
def other(settings: Settings, redis_client: Any) -> Iterator[TestClient]:
    """A second API instance: its own process-local cache."""
    with TestClient(create_app(settings)) as c:
        yield c


def statements_on(client: TestClient) -> list[str]:
    """SQL statements the app behind `client` sends from now on (appended as they run)."""
    engine: Engine = client.app.state.ctx.sessions.kw["bind"]  # type: ignore[attr-defined]
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _record(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    return seen


def submit(client: TestClient, key: str, name: str = "demo") -> Any:
    return client.post(
        f"/v1/deployments/{name}/jobs", json={"input": {"prompt": "x"}}, headers=h(key)
    )


def test_a_cached_call_reads_no_key_deployment_or_tenant(
    other: TestClient, client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"])
    assert submit(other, keys["a"]).status_code == 202  # fills the cache of `other`
    seen = statements_on(other)
    assert submit(other, keys["a"]).status_code == 202
    tables = ("api_keys", "deployments", "tenants")
    assert seen and not [
        s
        for s in seen
        if s.lstrip().upper().startswith("SELECT") and any(f"FROM {t}" in s for t in tables)
    ], seen


def test_a_revoked_key_is_refused_by_every_api_on_the_next_request(
    other: TestClient, client: TestClient, keys: dict[str, str]
) -> None:
    new = client.post("/v1/keys", json={"scopes": ["run", "read"]}, headers=h(keys["a"])).json()
    deploy(client, keys["a"])
    assert submit(other, new["key"]).status_code == 202  # cached by `other`
    assert other.get("/v1/jobs", headers=h(new["key"])).status_code == 200
    assert client.delete(f"/v1/keys/{new['id']}", headers=h(keys["a"])).status_code == 204
    assert submit(other, new["key"]).status_code == 401
    assert other.get("/v1/jobs", headers=h(new["key"])).status_code == 401


def test_a_new_deployment_version_is_used_by_the_next_call(
    other: TestClient, client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"], defaults={"max_tokens": 5})
    first = submit(other, keys["a"]).json()
    assert (first["deployment_version"], first["input"]["max_tokens"]) == (1, 5)
    r = client.put(
        "/v1/deployments/demo", json={**SPEC, "defaults": {"max_tokens": 7}}, headers=h(keys["a"])
    )
    assert r.status_code == 200, r.text
    second = submit(other, keys["a"]).json()
    assert (second["deployment_version"], second["input"]["max_tokens"]) == (2, 7)
    assert client.delete("/v1/deployments/demo", headers=h(keys["a"])).status_code == 204
    gone = submit(other, keys["a"])
    assert gone.status_code == 404, gone.text


def test_without_redis_every_call_reads_the_database(
    other: TestClient, client: TestClient, keys: dict[str, str]
) -> None:
    """The generation unreadable: nothing is served from the cache (a change made meanwhile
    could not be noticed), calls still work and a revocation still holds."""
    import redis

    new = client.post("/v1/keys", json={"scopes": ["read"]}, headers=h(keys["a"])).json()
    assert other.get("/v1/jobs", headers=h(new["key"])).status_code == 200  # cached
    edge = other.app.state.ctx.edge  # type: ignore[attr-defined]
    edge._redis = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    seen = statements_on(other)
    assert other.get("/v1/jobs", headers=h(new["key"])).status_code == 200
    assert any("FROM api_keys" in s for s in seen), "the key was read from the database"
    assert client.delete(f"/v1/keys/{new['id']}", headers=h(keys["a"])).status_code == 204
    assert other.get("/v1/jobs", headers=h(new["key"])).status_code == 401

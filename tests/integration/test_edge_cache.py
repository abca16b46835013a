"""The per-process cache of what every call reads first (key, deployment, quota limits): two API
instances on one database and one Redis, as two API processes are. A change committed through
one is seen by the other's next request; a cached request reads none of it from SQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from common.protocol import EDGE_CACHE_GENERATION_KEY, rate_limit_key
from control_plane.api.app import create_app
from control_plane.db.models import Tenant
from control_plane.services.tenants import api_keys
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


def generation_reads(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """GETs of the generation the app behind `client` sends from now on."""
    edge = client.app.state.ctx.edge  # type: ignore[attr-defined]
    real, reads = edge._redis.get, []

    def counting(key: str) -> Any:
        reads.append(key)
        return real(key)

    monkeypatch.setattr(edge._redis, "get", counting)
    return reads


def bucket(redis_client: Any, tenant_id: str) -> tuple[float, float] | None:
    """The tenant's request bucket as stored (level, time of its last change in ms); None when
    it is full and expired."""
    raw = redis_client.hgetall(rate_limit_key(tenant_id, "requests"))
    return (float(raw[b"level"]), float(raw[b"ts"])) if raw else None


def level_at(stored: tuple[float, float] | None, at_ms: float, limit: int) -> float:
    """What a bucket as stored holds at `at_ms` (it refills at limit / 60 s): two stores of
    one bucket hold the same at every moment when no call was charged between them (a refused
    call's charge given back keeps its time, not the one before)."""
    if stored is None:
        return float(limit)
    level, ts = stored
    return min(float(limit), level + (at_ms - ts) * limit / 60_000)


def charged_between(
    redis_client: Any, before: tuple[float, float] | None, tenant_id: str, limit: int
) -> float:
    """Units charged to the request bucket since `before` was read, net of what was given back
    (0 when nothing was), as of now."""
    seconds, micros = redis_client.time()
    now_ms = seconds * 1000 + micros // 1000
    after = bucket(redis_client, tenant_id)
    return level_at(before, now_ms, limit) - level_at(after, now_ms, limit)


def test_an_admission_confirms_the_generation_in_its_quota_script_instead_of_reading_it(
    other: TestClient, client: TestClient, keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy(client, keys["a"])
    assert submit(other, keys["a"]).status_code == 202  # cached, the generation seen
    reads = generation_reads(other, monkeypatch)
    assert submit(other, keys["a"]).status_code == 202
    assert reads == [], "an admission spares the GET"
    assert other.get("/v1/jobs", headers=h(keys["a"])).status_code == 200
    assert reads == [EDGE_CACHE_GENERATION_KEY], "other calls read it"


def test_a_call_decided_on_a_moved_generation_is_charged_nothing_and_decided_again(
    other: TestClient,
    client: TestClient,
    keys: dict[str, str],
    redis_client: Any,
) -> None:
    new = client.post("/v1/keys", json={"scopes": ["run", "read"]}, headers=h(keys["a"])).json()
    deploy(client, keys["a"])
    assert submit(other, new["key"]).status_code == 202  # cached by `other`
    # the tenant's in-flight limit lowered to what it has, committed through the other API
    # (its commit hook bumps the generation)
    with client.app.state.ctx.sessions() as s:  # type: ignore[attr-defined]
        tenant_id = api_keys.authenticate(s, new["key"]).tenant_id
        t = s.get(Tenant, tenant_id)
        assert t is not None
        t.max_in_flight = 1
        s.commit()
    per_min = client.app.state.ctx.settings.default_requests_per_min  # type: ignore[attr-defined]
    before = bucket(redis_client, tenant_id)
    assert before is not None and before[0] < per_min, "the first call was charged"
    refused = submit(other, new["key"])
    assert refused.status_code == 429 and refused.json()["limit"] == 1, "the new limit, at once"
    assert abs(charged_between(redis_client, before, tenant_id, per_min)) < 1e-6, "nothing"
    assert client.delete(f"/v1/keys/{new['id']}", headers=h(keys["a"])).status_code == 204
    assert submit(other, new["key"]).status_code == 401
    assert abs(charged_between(redis_client, before, tenant_id, per_min)) < 1e-6, "nothing"


def test_a_revocation_holds_when_redis_fails_between_a_call_and_its_quota_script(
    other: TestClient, client: TestClient, keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generation last seen cannot be confirmed: the call is decided again on the database
    (the generation unreadable, as in the test above), where the key is revoked."""
    new = client.post("/v1/keys", json={"scopes": ["run"]}, headers=h(keys["a"])).json()
    deploy(client, keys["a"])
    assert submit(other, new["key"]).status_code == 202  # cached by `other`
    assert client.delete(f"/v1/keys/{new['id']}", headers=h(keys["a"])).status_code == 204
    ctx = other.app.state.ctx  # type: ignore[attr-defined]

    def down(*_args: Any, **_kw: Any) -> Any:
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(ctx.quotas, "_script", down)
    monkeypatch.setattr(ctx.quotas._redis.connection_pool, "get_connection", down)
    monkeypatch.setattr(ctx.edge._redis, "get", down)
    assert submit(other, new["key"]).status_code == 401

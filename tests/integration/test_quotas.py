"""Per-tenant quotas: token buckets in Redis (one Lua script), in-flight cap, 429 with
Retry-After, correct across two API processes, fail-open vs fail-closed without Redis."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from common.protocol import rate_limit_key
from control_plane.api.app import create_app
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.embedded.processes import ManagedProcess, free_port, spawn, wait_until
from control_plane.errors import RateLimited
from control_plane.services.tenants import api_keys
from control_plane.services.tenants.quotas import Limits, Quotas
from control_plane.settings import Settings
from tests.integration.api_helpers import SPEC, WORKER_TOKEN, deploy, h


def tenant_key(database_url: str, **limits: int) -> str:
    engine = make_engine(database_url)
    now = datetime.now(UTC)
    with make_sessionmaker(engine)() as s:
        t = api_keys.create_tenant(s, "limited", now)
        for k, v in limits.items():
            setattr(t, k, v)
        s.flush()
        _, key = api_keys.create_api_key(s, t.id, {"admin"}, now)
        s.commit()
    engine.dispose()
    return key


def submit(client: httpx.Client | TestClient, key: str, prompt: str = "x") -> httpx.Response:
    return client.post(
        "/v1/deployments/demo/jobs",
        json={"input": {"prompt": prompt, "max_tokens": 4}},
        headers=h(key),
    )


def test_requests_per_minute(client: TestClient, database_url: str) -> None:
    key = tenant_key(database_url, requests_per_min=3)
    deploy(client, key)
    codes = [submit(client, key).status_code for _ in range(4)]
    assert codes == [202, 202, 202, 429]
    r = submit(client, key)
    assert r.headers["content-type"].startswith("application/problem+json")
    assert 1 <= int(r.headers["Retry-After"]) <= 20
    assert r.json()["limit"] == 3, "the 429 names the limit it hit"
    assert len(client.get("/v1/jobs", headers=h(key)).json()["data"]) == 3, "no side effect"


def test_tokens_per_minute(client: TestClient, database_url: str) -> None:
    key = tenant_key(database_url, tokens_per_min=40)
    deploy(client, key)
    assert submit(client, key, "a" * 60).status_code == 202  # ~16 + 4 tokens
    assert submit(client, key, "a" * 60).status_code == 202
    r = submit(client, key, "a" * 60)
    assert r.status_code == 429 and "tokens" in r.json()["detail"]
    assert r.json()["limit"] == 40
    huge = submit(client, key, "a" * 400)
    assert huge.status_code == 422, "more than the whole limit: no wait would admit it"
    assert huge.json()["limit"] == 40 and "Retry-After" not in huge.headers


def test_in_flight_cap(client: TestClient, database_url: str) -> None:
    key = tenant_key(database_url, max_in_flight=2)
    deploy(client, key)
    first = submit(client, key).json()["id"]
    assert submit(client, key).status_code == 202
    r = submit(client, key)
    assert r.status_code == 429 and r.json()["limit"] == 2
    client.post(f"/v1/jobs/{first}/cancel", headers=h(key))
    assert submit(client, key).status_code == 202


def test_a_call_the_in_flight_cap_refuses_is_charged_nothing(
    client: TestClient, database_url: str
) -> None:
    """The quota script runs while the database counts the tenant's jobs (quotas.py): a call
    the count then refuses is given its charge back. Two requests a minute (one more each 30 s):
    had the refused calls kept theirs, the last call would find none left."""
    key = tenant_key(database_url, requests_per_min=2, max_in_flight=1)
    deploy(client, key)
    first = submit(client, key).json()["id"]
    for _ in range(3):
        r = submit(client, key)
        assert r.status_code == 429 and r.json()["limit"] == 1, "the in-flight cap"
    client.post(f"/v1/jobs/{first}/cancel", headers=h(key))
    assert submit(client, key).status_code == 202
    assert submit(client, key).status_code == 429, "and the requests per minute still hold"


def test_idempotent_replay_is_not_charged(client: TestClient, database_url: str) -> None:
    key = tenant_key(database_url, requests_per_min=2)
    deploy(client, key)
    hdr = {**h(key), "Idempotency-Key": "same"}
    body = {"input": {"prompt": "x"}}
    first = client.post("/v1/deployments/demo/jobs", json=body, headers=hdr)
    assert first.status_code == 202
    for _ in range(3):  # the quota script runs beside the key's lookup: its charge given back
        again = client.post("/v1/deployments/demo/jobs", json=body, headers=hdr)
        assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
    assert submit(client, key).status_code == 202, "the second request of the minute"
    assert submit(client, key).status_code == 429
    replay = client.post("/v1/deployments/demo/jobs", json=body, headers=hdr)
    assert replay.status_code == 202, "a replay is answered at the limit too"


@pytest.mark.parametrize("fail_open", [True, False])
def test_redis_down(database_url: str, fail_open: bool) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings = Settings(
        database_url=database_url,
        redis_url=dead,
        worker_token=WORKER_TOKEN,
        quota_fail_open=fail_open,
        validate_models=False,  # the deployed model does not exist; no worker loads it
    )
    key = tenant_key(database_url)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/deployments", json=SPEC, headers=h(key)).status_code == 201
        r = submit(client, key)
        jobs = client.get("/v1/jobs", headers=h(key)).json()["data"]
    if fail_open:
        # Admitted and committed: the reconciler sends the wake-up once Redis is back.
        assert r.status_code == 202 and [j["id"] for j in jobs] == [r.json()["id"]]
    else:
        assert r.status_code == 503 and jobs == []


@pytest.fixture
def two_api_processes(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[list[str]]:
    procs: list[ManagedProcess] = []
    urls = []
    try:
        for i in range(2):
            port = free_port()
            env = {
                **os.environ,
                "PLATFORM_DATABASE_URL": database_url,
                "PLATFORM_REDIS_URL": redis_url,
                "PLATFORM_API_PORT": str(port),
                "PLATFORM_WORKER_TOKEN": WORKER_TOKEN,
                "PLATFORM_VALIDATE_MODELS": "false",  # the deployed model does not exist
            }
            p = spawn(
                f"api{i}",
                [sys.executable, "-m", "control_plane.api"],
                tmp_path / f"api{i}.log",
                env=env,
            )
            procs.append(p)
            url = f"http://127.0.0.1:{port}"
            wait_until(p, lambda u=url: httpx.get(u + "/healthz").status_code == 200, 60)
            urls.append(url)
        yield urls
    finally:
        for p in procs:
            p.stop()


def test_limits_hold_across_two_api_processes(
    two_api_processes: list[str], database_url: str, redis_client: object
) -> None:
    key = tenant_key(database_url, requests_per_min=4)
    a, b = (httpx.Client(base_url=u) for u in two_api_processes)
    assert a.post("/v1/deployments", json=SPEC, headers=h(key)).status_code == 201
    codes = [submit(c, key).status_code for c in (a, b, a, b, a, b)]
    assert codes.count(202) == 4 and codes.count(429) == 2
    a.close()
    b.close()


LIMITS = Limits(requests_per_min=3, tokens_per_min=1_000, max_in_flight=5)


def _left(r: redis.Redis, tenant_id: str) -> int:
    """Requests the tenant's bucket still admits now (it refills one per 20 s: none meanwhile)."""
    level = r.hget(rate_limit_key(tenant_id, "requests"), "level")
    return LIMITS.requests_per_min if level is None else int(float(level))


def test_the_script_is_read_after_the_count_and_survives_a_restarted_redis(
    redis_client: redis.Redis,
) -> None:
    """`Quotas.admit` writes the script, counts, then reads the answer on the same connection.
    What a restarted Redis leaves (no script loaded, pooled connections closed) is run again
    the plain way: nothing had run, so nothing is charged twice."""
    quotas = Quotas(redis_client, fail_open=False)
    order: list[str] = []
    real_send = quotas._send

    def send(*a: Any) -> Any:
        order.append("script sent")
        return real_send(*a)

    quotas._send = send  # type: ignore[method-assign,assignment]

    def count() -> int:
        order.append("counted")
        return 0

    quotas.admit("ten_a", LIMITS, 10, count)
    assert order == ["script sent", "counted"] and _left(redis_client, "ten_a") == 2
    redis_client.script_flush()  # as after a restart: the script is gone
    quotas.admit("ten_a", LIMITS, 10, lambda: 0)
    assert _left(redis_client, "ten_a") == 1
    redis_client.client_kill_filter(skipme=True)  # every other connection closed by the server
    quotas.admit("ten_a", LIMITS, 10, lambda: 0)
    assert _left(redis_client, "ten_a") == 0
    with pytest.raises(RateLimited):
        quotas.admit("ten_a", LIMITS, 10, lambda: 0)


def test_a_count_that_fails_gives_the_charge_back(redis_client: redis.Redis) -> None:
    quotas = Quotas(redis_client, fail_open=False)

    def count() -> int:
        raise RuntimeError("database gone")

    for _ in range(LIMITS.requests_per_min + 1):
        with pytest.raises(RuntimeError):
            quotas.admit("ten_b", LIMITS, 10, count)
    assert _left(redis_client, "ten_b") == LIMITS.requests_per_min
    # and the pool's connections are whole: the next call reads its own answer
    quotas.admit("ten_b", LIMITS, 10, lambda: 0)
    assert _left(redis_client, "ten_b") == LIMITS.requests_per_min - 1

"""Internal addresses spelled as IPv6 (NAT64, IPv4-compatible, IPv4-mapped, 6to4, Teredo) are
refused as webhook targets wherever a URL is accepted — an endpoint, a job, a batch — and again
at delivery, when private targets are not allowed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.jobs import webhook_delivery
from control_plane.services.jobs.webhook_delivery import DeliveryEnv, Message
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER_TOKEN, h
from tests.integration.webhooks.helpers import Env, deliveries, deploy, job, submit, unique

SPELLINGS = [
    "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",  # NAT64 of 169.254.169.254
    "http://[64:ff9b:1::a9fe:a9fe]/",  # local-use NAT64
    "http://[::127.0.0.1]:9/x",  # IPv4-compatible
    "http://[::ffff:127.0.0.1]:9/x",  # IPv4-mapped
    "http://[2002:a9fe:a9fe::]/",  # 6to4
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",  # Teredo, client 127.0.0.1
]


def strict_settings(env: Env) -> Settings:
    return Settings(
        database_url=env.settings.database_url,
        redis_url=env.settings.redis_url,
        worker_token=WORKER_TOKEN,
        webhook_allow_private=False,
        validate_models=False,
    )


@pytest.fixture
def strict(env: Env) -> Iterator[TestClient]:
    """The API of the package's database with private webhook targets refused."""
    with TestClient(create_app(strict_settings(env))) as c:
        yield c


def refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 422, r.text
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "non-public" in problem["detail"]
    assert [e["field"] for e in problem["errors"]] == [field]


@pytest.mark.parametrize("url", SPELLINGS)
def test_an_endpoint_on_an_internal_address_is_refused(
    env: Env, keys: dict[str, str], strict: TestClient, url: str
) -> None:
    r = strict.post("/v1/webhooks/endpoints", json={"url": url}, headers=h(keys["a"]))
    refused(r, "url")
    assert strict.get("/v1/webhooks/endpoints", headers=h(keys["a"])).json()["data"] == []


def test_jobs_and_batches_with_an_internal_webhook_are_refused(
    env: Env, keys: dict[str, str], strict: TestClient
) -> None:
    a = h(keys["a"])
    deploy(env, keys["a"])
    for url in SPELLINGS:
        body = {"input": {"prompt": "hi"}, "webhook": url}
        refused(strict.post("/v1/deployments/demo/jobs", json=body, headers=a), "webhook")
        batch = {"deployment": "demo", "inputs": [{"prompt": "a"}], "webhook": url}
        refused(strict.post("/v1/batches", json=batch, headers=a), "webhook")
    # Nothing was created by the refused calls.
    assert strict.get("/v1/jobs", headers=a).json()["data"] == []
    assert strict.get("/v1/batches", headers=a).json()["data"] == []
    # A public address in the same spellings is accepted.
    ok = {"input": {"prompt": "hi"}, "webhook": "http://[64:ff9b::808:808]/hook"}
    assert strict.post("/v1/deployments/demo/jobs", json=ok, headers=a).status_code == 202


@pytest.mark.parametrize("url", ["http://[::1/", "http://h:99999/", "http://h:abc/"])
def test_a_malformed_webhook_url_is_a_422(
    env: Env, keys: dict[str, str], strict: TestClient, url: str
) -> None:
    r = strict.post("/v1/webhooks/endpoints", json={"url": url}, headers=h(keys["a"]))
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["url"]


def test_delivery_refuses_an_ipv6_spelling_of_loopback(env: Env, keys: dict[str, str]) -> None:
    """Accepted while private targets were allowed, refused by a sender where they are not,
    before a connection is tried: the NAT64 spelling of the receiver's loopback address."""
    deploy(env, keys["a"])
    path = unique("/nat64")
    port = env.receiver.url("").rsplit(":", 1)[1]
    jid = submit(env, keys["a"], f"http://[64:ff9b::7f00:1]:{port}{path}", ["started"])
    engine = make_engine(env.settings.database_url)
    r = redis.Redis.from_url(env.settings.redis_url)
    with httpx.Client() as http:
        delivery_env = DeliveryEnv(strict_settings(env), make_sessionmaker(engine), http, r)
        msg = Message("job.completed", f"msg_{jid}_nat64", 1, job_id=jid)
        assert (
            webhook_delivery.deliver(delivery_env, msg, datetime.now(UTC), random.Random()) is None
        )
    [d] = deliveries(env, keys["a"], jid)
    assert d["status_code"] is None and "non-public" in d["error"], d
    assert "127.0.0.1 (NAT64)" in d["error"]
    assert job(env, keys["a"], jid)["webhook_status"] == "failed"
    assert env.receiver.at(path) == []
    r.close()
    engine.dispose()

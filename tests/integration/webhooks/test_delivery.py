"""Delivery: retries (one message id) until the receiver recovers, failure after the retry
schedule, 410 disabling the endpoint, redelivery and the delivery log's errors, and private
targets refused again at send time."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime

import httpx
import redis

from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.jobs import webhook_delivery
from control_plane.services.jobs.webhook_delivery import DeliveryEnv, Message
from control_plane.settings import Settings
from tests.integration.api_helpers import h
from tests.integration.webhooks.helpers import (
    Env,
    claim,
    complete,
    deliveries,
    deploy,
    job,
    submit,
    unique,
)


def test_retries_until_the_receiver_recovers(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    k = 2
    path = unique(f"/flaky/{k}")
    jid = submit(env, keys["a"], env.receiver.url(path))
    complete(env, jid, claim(env, jid))
    env.wait("delivered", lambda: job(env, keys["a"], jid)["webhook_status"] == "delivered")
    log = deliveries(env, keys["a"], jid)
    assert [(d["attempt"], d["status_code"], d["delivered"]) for d in log] == [
        (1, 500, False),
        (2, 500, False),
        (3, 200, True),
    ]
    got = env.receiver.at(path)
    assert len({r.headers["webhook-id"] for r in got}) == 1, "one message id for all attempts"
    gaps = [b.at - a.at for a, b in itertools.pairwise(got)]
    assert all(g >= 0.15 for g in gaps), gaps  # 0.2 s back-off, minus timer slack


def test_failed_after_the_retry_schedule(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    path = unique("/fail")
    jid = submit(env, keys["a"], env.receiver.url(path))
    complete(env, jid, claim(env, jid))
    env.wait("failed", lambda: job(env, keys["a"], jid)["webhook_status"] == "failed")
    assert [d["attempt"] for d in deliveries(env, keys["a"], jid)] == [1, 2, 3, 4]
    assert job(env, keys["a"], jid)["output"]["text"] == "the answer", "the output is kept"


def test_410_disables_the_endpoint(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    path = unique("/gone")
    url = env.receiver.url(path)
    ep = env.client.post("/v1/webhooks/endpoints", json={"url": url}, headers=h(keys["a"])).json()
    first = submit(env, keys["a"], url)
    complete(env, first, claim(env, first))
    env.wait("failed", lambda: job(env, keys["a"], first)["webhook_status"] == "failed")
    [d] = deliveries(env, keys["a"], first)
    assert d["status_code"] == 410 and d["attempt"] == 1
    now_ep = env.client.get(f"/v1/webhooks/endpoints/{ep['id']}", headers=h(keys["a"])).json()
    assert now_ep["disabled_at"] is not None and "410" in now_ep["disabled_reason"]

    second = submit(env, keys["a"], url)
    complete(env, second, claim(env, second))
    env.wait("failed", lambda: job(env, keys["a"], second)["webhook_status"] == "failed")
    [d] = deliveries(env, keys["a"], second)
    assert d["status_code"] is None and "disabled" in d["error"]
    assert len(env.receiver.at(path)) == 1, "nothing more is sent to a disabled endpoint"


def test_redeliver_and_log_errors(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    jid = submit(env, keys["a"], env.receiver.url(unique("/ok")))
    r = env.client.post(f"/v1/jobs/{jid}/webhook/redeliver", headers=h(keys["a"]))
    assert r.status_code == 409 and "queued" in r.json()["detail"]
    b = h(keys["b"])
    assert env.client.post(f"/v1/jobs/{jid}/webhook/redeliver", headers=b).status_code == 404
    assert env.client.get(f"/v1/jobs/{jid}/webhook/deliveries", headers=b).status_code == 404
    assert (
        env.client.post(f"/v1/jobs/{jid}/webhook/redeliver", headers=h(keys["ro"])).status_code
        == 403
    )
    body = {"input": {"prompt": "hi"}}
    plain = env.client.post("/v1/deployments/demo/jobs", json=body, headers=h(keys["a"])).json()
    complete(env, plain["id"], claim(env, plain["id"]))
    r = env.client.post(f"/v1/jobs/{plain['id']}/webhook/redeliver", headers=h(keys["a"]))
    assert r.status_code == 409 and "no webhook" in r.json()["detail"]
    assert deliveries(env, keys["a"], plain["id"]) == []


def test_delivery_refuses_private_targets_at_send_time(env: Env, keys: dict[str, str]) -> None:
    """DNS may change after a URL was accepted: the target is checked again before sending."""
    deploy(env, keys["a"])
    path = unique("/ok")
    # Accepted while private targets were allowed ...
    jid = submit(env, keys["a"], env.receiver.url(path), ["started"])
    strict = Settings(
        database_url=env.settings.database_url,
        redis_url=env.settings.redis_url,
        webhook_allow_private=False,
    )
    engine = make_engine(strict.database_url)
    r = redis.Redis.from_url(strict.redis_url)
    with httpx.Client() as http:
        # ... delivered by a process where they are not (the service function, called directly).
        delivery_env = DeliveryEnv(strict, make_sessionmaker(engine), http, r)
        msg = Message("job.completed", f"msg_{jid}_test", 1, job_id=jid)
        assert (
            webhook_delivery.deliver(delivery_env, msg, datetime.now(UTC), random.Random()) is None
        )
    [d] = deliveries(env, keys["a"], jid)
    assert d["status_code"] is None and "non-public" in d["error"]
    assert job(env, keys["a"], jid)["webhook_status"] == "failed"
    assert env.receiver.at(path) == []
    r.close()
    engine.dispose()

"""Webhooks end to end: the API in process, a real Celery worker process (never eager mode)
on a real Redis, real SQL, a real HTTP receiver; signatures checked with `standardwebhooks`.

The worker, the database and the receiver live for the whole module (starting a worker costs
seconds); every test uses fresh tenants, so tests do not see each other's data.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select
from standardwebhooks import Webhook

from common.protocol import EventType
from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.db.models import Job, Tenant
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.providers.local import die_with_parent
from control_plane.reconcile import batches as batch_reconciler
from control_plane.reconcile.env import Env as ReconcileEnv
from control_plane.services.jobs import events, webhook_delivery
from control_plane.services.jobs.dispatch import make_celery
from control_plane.services.jobs.webhook_delivery import DeliveryEnv, Message
from control_plane.settings import Settings
from control_plane.tasks_api import enqueue_output_follower
from tests.conftest import S3Server
from tests.helpers import wait_for
from tests.integration.api_helpers import WORKER, WORKER_TOKEN, h, tenant_keys

# Redis database of this module (others flush database 0 between tests).
REDIS_DB = 3
OUTPUT_INTERVAL_S = 0.4
RETRY_SCHEDULE_S = "[0.2,0.2,0.2]"
WAIT_S = 20.0


@dataclass
class Received:
    path: str  # request path at the receiver
    headers: dict[str, str]  # lower-cased header names
    body: bytes  # raw body (signatures cover these bytes)
    at: float  # monotonic time of arrival

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """HTTP receiver whose behaviour is chosen by the path:

    /ok/...         200
    /flaky/K/...    500 for the first K requests, then 200
    /fail/...       always 500
    /gone/...       410
    """

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    seen = sum(1 for r in receiver.received if r.path == self.path)
                    receiver.received.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.monotonic(),
                        )
                    )
                parts = self.path.strip("/").split("/")
                code = {"ok": 200, "fail": 500, "gone": 410}.get(parts[0], 200)
                if parts[0] == "flaky":
                    code = 500 if seen < int(parts[1]) else 200
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Env:
    client: TestClient  # the API (allow_private: the receiver is on loopback)
    settings: Settings
    receiver: Receiver
    worker: subprocess.Popen[bytes]  # the Celery worker process
    log: Path  # its log

    def wait(self, what: str, check: Callable[[], Any]) -> Any:
        """`check()` once it is truthy; fails at once if the Celery worker exited, and with the
        tail of its log either way."""

        def checked() -> Any:
            value = check()
            if not value and self.worker.poll() is not None:
                pytest.fail(f"celery worker exited ({self.worker.returncode}):\n{self.tail()}")
            return value

        try:
            return wait_for(checked, WAIT_S, what=what)
        except AssertionError as e:
            pytest.fail(f"{e}; worker log:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_server: S3Server
) -> Iterator[Env]:
    d = tmp_path_factory.mktemp("webhooks")
    database_url = f"sqlite:///{d / 'platform.db'}"
    upgrade(database_url)
    module_redis = redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.Redis.from_url(module_redis).flushdb()
    settings = Settings(
        database_url=database_url,
        redis_url=module_redis,
        s3_endpoint_url=s3_server.url,
        worker_token=WORKER_TOKEN,
        webhook_allow_private=True,
        results_bucket="results-webhooks",
        validate_models=False,  # the deployed model does not exist; no worker loads it
    )
    child_env = {
        **os.environ,
        **s3_server.env(),
        "PLATFORM_DATABASE_URL": database_url,
        "PLATFORM_REDIS_URL": module_redis,
        "PLATFORM_WEBHOOK_ALLOW_PRIVATE": "true",
        "PLATFORM_WEBHOOK_RETRY_SCHEDULE_S": RETRY_SCHEDULE_S,
        "PLATFORM_WEBHOOK_OUTPUT_INTERVAL_S": str(OUTPUT_INTERVAL_S),
        "PLATFORM_WEBHOOK_TIMEOUT_S": "3",
    }
    log = d / "celery.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "control_plane.tasks",
                "worker",
                "-Q",
                "platform.control",
                "-P",
                "threads",
                "-c",
                "2",
                "-l",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=Path(__file__).resolve().parents[2],
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    receiver = Receiver()
    aws = pytest.MonkeyPatch()
    for k, v in s3_server.env().items():
        aws.setenv(k, v)  # this process writes batch results too
    try:
        with TestClient(create_app(settings)) as client:
            yield Env(client, settings, receiver, worker, log)
    finally:
        aws.undo()
        receiver.close()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@pytest.fixture
def keys(env: Env) -> dict[str, str]:
    """Fresh tenants A and B (admin keys) and a read-only key of A, in the module's database."""
    return tenant_keys(env.settings.database_url)


def unique(prefix: str) -> str:
    return f"{prefix}/{random.getrandbits(40):x}"


def deploy(env: Env, key: str) -> None:
    spec = {"name": "demo", "model": "store://models/demo/"}
    assert env.client.post("/v1/deployments", json=spec, headers=h(key)).status_code == 201


def submit(env: Env, key: str, url: str, events: list[str] | None = None) -> str:
    body: dict[str, Any] = {"input": {"prompt": "hi"}, "webhook": url}
    if events is not None:
        body["webhook_events"] = events
    r = env.client.post("/v1/deployments/demo/jobs", json=body, headers=h(key))
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    return job_id


def claim(env: Env, job_id: str) -> int:
    r = env.client.post(f"/internal/jobs/{job_id}/claim", json={"worker_id": "w"}, headers=WORKER)
    assert r.status_code == 200, r.text
    attempt: int = r.json()["attempt"]
    return attempt


def complete(env: Env, job_id: str, attempt: int, text: str = "the answer") -> None:
    body = {
        "worker_id": "w",
        "attempt": attempt,
        "status": "succeeded",
        "output": {"text": text, "finish_reason": "stop"},
    }
    r = env.client.post(f"/internal/jobs/{job_id}/complete", json=body, headers=WORKER)
    assert r.status_code == 200, r.text


def job(env: Env, key: str, job_id: str) -> dict[str, Any]:
    out: dict[str, Any] = env.client.get(f"/v1/jobs/{job_id}", headers=h(key)).json()
    return out


def deliveries(env: Env, key: str, job_id: str) -> list[dict[str, Any]]:
    r = env.client.get(f"/v1/jobs/{job_id}/webhook/deliveries", headers=h(key))
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def verify(secret: str, r: Received) -> dict[str, Any]:
    out: dict[str, Any] = Webhook(secret).verify(r.body, r.headers)
    return out


def test_endpoint_management(env: Env, keys: dict[str, str]) -> None:
    c, a = env.client, h(keys["a"])
    url = env.receiver.url(unique("/ok"))
    r = c.post("/v1/webhooks/endpoints", json={"url": url}, headers=a)
    assert r.status_code == 201, r.text
    ep = r.json()
    assert ep["url"] == url and ep["secret"].startswith("whsec_") and ep["disabled_at"] is None
    assert c.post("/v1/webhooks/endpoints", json={"url": url}, headers=a).status_code == 409
    assert c.get(f"/v1/webhooks/endpoints/{ep['id']}", headers=a).json()["secret"] == ep["secret"]
    listed = c.get("/v1/webhooks/endpoints", headers=a).json()["data"]
    assert [e["id"] for e in listed] == [ep["id"]] and "secret" not in listed[0]

    rotated = c.post(f"/v1/webhooks/endpoints/{ep['id']}/rotate", headers=a).json()
    assert rotated["secret"] != ep["secret"] and rotated["secret"].startswith("whsec_")
    left_s = (
        datetime.fromisoformat(rotated["previous_secret_expires_at"]) - datetime.now(UTC)
    ).total_seconds()
    assert 23 * 3600 < left_s <= 24 * 3600

    # Errors: bad URL, scope, other tenant, unknown id.
    r = c.post("/v1/webhooks/endpoints", json={"url": "ftp://x/y"}, headers=a)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "url"
    r = c.post("/v1/webhooks/endpoints", json={"url": url + "/2"}, headers=h(keys["ro"]))
    assert r.status_code == 403
    assert c.get("/v1/webhooks/endpoints", headers=h(keys["ro"])).status_code == 403
    b = h(keys["b"])
    for method, path in [
        ("GET", f"/v1/webhooks/endpoints/{ep['id']}"),
        ("POST", f"/v1/webhooks/endpoints/{ep['id']}/rotate"),
        ("DELETE", f"/v1/webhooks/endpoints/{ep['id']}"),
    ]:
        assert c.request(method, path, headers=b).status_code == 404, path
    assert c.get("/v1/webhooks/endpoints", headers=b).json()["data"] == []

    assert c.delete(f"/v1/webhooks/endpoints/{ep['id']}", headers=a).status_code == 204
    assert c.get(f"/v1/webhooks/endpoints/{ep['id']}", headers=a).status_code == 404


def test_private_endpoint_refused_without_allow_private(
    env: Env, keys: dict[str, str], redis_url: str
) -> None:
    strict = Settings(
        database_url=env.settings.database_url,
        redis_url=env.settings.redis_url,
        worker_token=WORKER_TOKEN,
        webhook_allow_private=False,
    )
    with TestClient(create_app(strict)) as c:
        for url in ("http://127.0.0.1:9/x", "http://169.254.169.254/latest", "http://10.0.0.1/"):
            r = c.post("/v1/webhooks/endpoints", json={"url": url}, headers=h(keys["a"]))
            assert r.status_code == 422 and "non-public" in r.json()["detail"], url
        assert c.get("/v1/webhooks/endpoints", headers=h(keys["a"])).json()["data"] == []


def test_events_are_signed_with_the_endpoint_secret_and_rotation_keeps_both(
    env: Env, keys: dict[str, str]
) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    url = env.receiver.url(path)
    ep = env.client.post("/v1/webhooks/endpoints", json={"url": url}, headers=h(keys["a"])).json()
    jid = submit(env, keys["a"], url, ["started", "completed"])
    complete(env, jid, claim(env, jid))
    got = env.wait(
        "job.started and job.completed", lambda: env.receiver.at(path)[1:] and env.receiver.at(path)
    )
    by_type = {verify(ep["secret"], r)["type"]: r for r in got}
    assert set(by_type) == {"job.started", "job.completed"}
    done = verify(ep["secret"], by_type["job.completed"])
    assert done["data"]["id"] == jid and done["data"]["output"]["text"] == "the answer"
    assert len(got[0].headers["webhook-signature"].split(" ")) == 1
    env.wait("delivered", lambda: job(env, keys["a"], jid)["webhook_status"] == "delivered")
    # Another tenant's secret does not verify.
    other = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    with pytest.raises(Exception, match=r"(?i)signature"):
        verify(other, by_type["job.completed"])

    new = env.client.post(f"/v1/webhooks/endpoints/{ep['id']}/rotate", headers=h(keys["a"])).json()
    r = env.client.post(f"/v1/jobs/{jid}/webhook/redeliver", headers=h(keys["a"]))
    assert r.status_code == 202, r.text
    again = env.wait("redelivery", lambda: env.receiver.at(path)[2:])[0]
    assert again.headers["webhook-id"] == r.json()["msg_id"]
    assert again.headers["webhook-id"] != by_type["job.completed"].headers["webhook-id"]
    assert len(again.headers["webhook-signature"].split(" ")) == 2
    assert verify(new["secret"], again)["type"] == "job.completed"
    assert verify(ep["secret"], again)["data"]["id"] == jid  # the old one, within 24 h

    log = env.wait(
        "the delivery log",
        lambda: deliveries(env, keys["a"], jid)[2:] and deliveries(env, keys["a"], jid),
    )
    assert sorted(
        (d["event_type"], d["attempt"], d["status_code"], d["delivered"]) for d in log
    ) == [
        ("job.completed", 1, 200, True),
        ("job.completed", 1, 200, True),
        ("job.started", 1, 200, True),
    ]
    assert all("body" not in d and d["url"] == url for d in log)


def test_unregistered_urls_use_the_tenant_default_secret(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    jid = submit(env, keys["a"], env.receiver.url(path))
    complete(env, jid, claim(env, jid))
    [got] = env.wait("job.completed", lambda: env.receiver.at(path))
    secret = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    assert verify(secret, got)["data"]["status"] == "succeeded"


def test_rotating_the_default_secret_keeps_the_old_one_signing_for_the_overlap(
    env: Env, keys: dict[str, str]
) -> None:
    deploy(env, keys["a"])
    before = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()
    ro = env.client.post("/v1/webhooks/secret/rotate", headers=h(keys["ro"]))
    assert ro.status_code == 403
    assert env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json() == before

    rotated = env.client.post("/v1/webhooks/secret/rotate", headers=h(keys["a"])).json()
    assert rotated["secret"] != before["secret"] and rotated["secret"].startswith("whsec_")
    overlap = datetime.fromisoformat(rotated["previous_secret_expires_at"]) - datetime.now(UTC)
    assert 23.9 * 3600 < overlap.total_seconds() <= 24 * 3600
    assert env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json() == rotated

    path = unique("/ok")
    jid = submit(env, keys["a"], env.receiver.url(path))
    complete(env, jid, claim(env, jid))
    [got] = env.wait("job.completed", lambda: env.receiver.at(path))
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    assert verify(rotated["secret"], got)["data"]["id"] == jid
    assert verify(before["secret"], got)["data"]["id"] == jid  # receivers not yet updated

    # Once the overlap is over, only the new secret signs.
    engine = make_engine(env.settings.database_url)
    with make_sessionmaker(engine)() as s:
        tenant_id = s.scalars(select(Job.tenant_id).where(Job.id == jid)).one()
        tenant = s.get(Tenant, tenant_id)
        assert tenant is not None
        tenant.previous_webhook_secret_expires_at = datetime.now(UTC) - timedelta(seconds=1)
        s.commit()
    engine.dispose()
    assert env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json() == {
        "secret": rotated["secret"],
        "previous_secret_expires_at": None,
    }
    r = env.client.post(f"/v1/jobs/{jid}/webhook/redeliver", headers=h(keys["a"]))
    assert r.status_code == 202, r.text
    again = env.wait("redelivery", lambda: env.receiver.at(path)[1:])[0]
    assert len(again.headers["webhook-signature"].split(" ")) == 1
    assert verify(rotated["secret"], again)["data"]["id"] == jid
    with pytest.raises(Exception, match=r"(?i)signature"):
        verify(before["secret"], again)


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


def test_output_events_are_throttled_and_carry_the_text_so_far(
    env: Env, keys: dict[str, str]
) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    jid = submit(env, keys["a"], env.receiver.url(path), ["output", "completed"])
    attempt = claim(env, jid)
    celery = make_celery(env.settings)
    r = redis.Redis.from_url(env.settings.redis_url)
    # What the lead's claim route does for jobs asking for "output"; a second follower of the
    # same attempt stops at once.
    enqueue_output_follower(celery, jid, attempt)
    enqueue_output_follower(celery, jid, attempt)
    pieces = [f"tok{i} " for i in range(30)]
    for p in pieces:
        events.publish(r, jid, EventType.OUTPUT, {"delta": p})
        time.sleep(0.05)
    time.sleep(OUTPUT_INTERVAL_S * 3)  # the follower sends the last text before completion
    complete(env, jid, attempt, text="".join(pieces))
    env.wait(
        "job.completed",
        lambda: any(x.json()["type"] == "job.completed" for x in env.receiver.at(path)),
    )
    time.sleep(OUTPUT_INTERVAL_S)  # a late output event would show up now
    got = env.receiver.at(path)
    outputs = [x for x in got if x.json()["type"] == "job.output"]
    texts = [x.json()["data"]["output"]["text"] for x in outputs]
    assert 2 <= len(outputs) <= 1.5 / OUTPUT_INTERVAL_S + 3, texts
    assert len({x.headers["webhook-id"] for x in outputs}) == len(outputs)
    assert all("".join(pieces).startswith(t) for t in texts)
    assert texts == sorted(texts, key=len) and texts[-1] == "".join(pieces)
    gaps = [b.at - a.at for a, b in itertools.pairwise(outputs)]
    assert all(g >= OUTPUT_INTERVAL_S * 0.7 for g in gaps), gaps
    assert got[-1].json()["data"]["output"]["text"] == "".join(pieces)
    r.close()


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


def test_batch_completed_webhook(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    body = {"deployment": "demo", "inputs": [{"prompt": "a"}, {"prompt": "b"}]}
    r = env.client.post(
        "/v1/batches", json={**body, "webhook": env.receiver.url(path)}, headers=h(keys["a"])
    )
    assert r.status_code == 201, r.text
    batch = r.json()
    assert batch["webhook_status"] == "pending"
    engine = make_engine(env.settings.database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s:
        ids = list(s.scalars(select(Job.id).where(Job.batch_id == batch["id"])))
    for jid in ids:
        complete(env, jid, claim(env, jid), text=f"out {jid}")
    r = redis.Redis.from_url(env.settings.redis_url)
    with sessions() as s:
        renv = ReconcileEnv(env.settings, r, make_celery(env.settings), None)  # type: ignore[arg-type]
        batch_reconciler.pump(s, renv, datetime.now(UTC))
    [got] = env.wait("batch.completed", lambda: env.receiver.at(path))
    secret = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    msg = verify(secret, got)
    assert msg["type"] == "batch.completed" and msg["data"]["id"] == batch["id"]
    assert msg["data"]["counts"]["succeeded"] == 2 and msg["data"]["results_uri"]
    path_b = f"/v1/batches/{batch['id']}"
    env.wait(
        "delivered",
        lambda: (
            env.client.get(path_b, headers=h(keys["a"])).json()["webhook_status"] == "delivered"
        ),
    )
    log = env.client.get(f"{path_b}/webhook/deliveries", headers=h(keys["a"])).json()["data"]
    assert [(d["event_type"], d["delivered"]) for d in log] == [("batch.completed", True)]
    r.close()
    engine.dispose()


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


def test_a_job_asking_for_starting_events_hears_each_phase_of_its_cold_start(
    env: Env, keys: dict[str, str]
) -> None:
    from bench.reconciler_tick import RecordingProvider
    from common.protocol import worker_heartbeat_key
    from control_plane.reconcile.driver import Reconciler
    from control_plane.reconcile.env import Env as ReconcilerEnv

    deploy(env, keys["a"])
    path = unique("/starting")
    jid = submit(env, keys["a"], env.receiver.url(path), ["starting"])
    r = redis.Redis.from_url(env.settings.redis_url)
    provider = RecordingProvider()
    loop = Reconciler(
        ReconcilerEnv(env.settings, r, make_celery(env.settings), provider),
        make_sessionmaker(make_engine(env.settings.database_url)),
    )
    t0 = datetime.now(UTC) - timedelta(seconds=60)
    loop.tick(t0)
    # (other tests' deployments live on in this database: find this one's worker)
    dep_id = env.client.get("/v1/deployments/demo", headers=h(keys["a"])).json()["id"]
    (wid,) = [
        s.worker_id
        for s in provider.started
        if s.assignment and s.assignment.deployment_id == dep_id
    ]
    env.wait("job.starting (booting)", lambda: env.receiver.at(path))
    state = {"state": "loading", "at": (t0 + timedelta(seconds=1)).timestamp()}
    assert env.client.post(f"/internal/workers/{wid}/state", json=state, headers=WORKER).is_success
    beat = {"state": "loading", "progress": {"bytes_done": 10, "bytes_total": 100}}
    r.set(worker_heartbeat_key(wid), json.dumps(beat), ex=10)
    loop.tick(t0 + timedelta(seconds=2))
    loop.tick(t0 + timedelta(seconds=2.5))  # progress within the phase: no second webhook
    got = env.wait(
        "job.starting (loading)", lambda: env.receiver.at(path)[1:] and env.receiver.at(path)
    )
    secret = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    events = [verify(secret, m) for m in got]
    assert [e["type"] for e in events] == ["job.starting", "job.starting"]
    assert all(e["data"]["id"] == jid and e["data"]["status"] == "starting" for e in events)
    loading = events[1]["data"]
    assert loading["status_reason"] == "loading_weights"
    assert loading["cold_start"]["phase"] == "loading_weights"
    assert loading["cold_start"]["bytes_total"] == 100
    assert len({m.headers["webhook-id"] for m in got}) == 2
    time.sleep(0.5)
    assert len(env.receiver.at(path)) == 2


def test_a_lost_completed_webhook_is_sent_again_by_the_reconciler(
    env: Env, keys: dict[str, str]
) -> None:
    """Two lost chains, as a killed API (ended, never enqueued) and a killed Celery worker
    (attempt 1 recorded, its retry's message gone) leave them; and two that are not lost."""
    from control_plane.db.models import WebhookDelivery
    from control_plane.domain.webhook_resend import GRACE
    from control_plane.reconcile import webhooks
    from control_plane.services.webhooks.signing import message_id

    deploy(env, keys["a"])
    names = ("never", "retry", "recent", "done", "stuck")
    paths = {name: unique(f"/lost/{name}") for name in names}
    ids = {name: submit(env, keys["a"], env.receiver.url(p)) for name, p in paths.items()}
    now = datetime.now(UTC)
    long_ago = now - GRACE - timedelta(minutes=5)
    engine = make_engine(env.settings.database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s:
        for name, jid in ids.items():
            job_row = s.get(Job, jid)
            assert job_row is not None
            job_row.status, job_row.webhook_status = "succeeded", "pending"
            if name == "stuck":  # delivery finds no URL, records nothing: pending for good
                job_row.webhook_url = None
            job_row.completed_at = now if name == "recent" else long_ago
            if name in ("retry", "done"):
                s.add(
                    WebhookDelivery(
                        job_id=jid,
                        url=env.receiver.url(paths[name]),
                        msg_id=message_id(jid, "completed"),
                        event_type="job.completed",
                        attempt=1,
                        status_code=200 if name == "done" else 500,
                        delivered=name == "done",
                        created_at=long_ago,
                    )
                )
        s.commit()
        r = redis.Redis.from_url(env.settings.redis_url)
        renv = ReconcileEnv(env.settings, r, make_celery(env.settings), None)  # type: ignore[arg-type]
        assert webhooks.resend_lost(s, renv, now) == 3  # "never", "retry" and "stuck"
    for name in ("never", "retry"):
        got = env.wait(name, lambda n=name: env.receiver.at(paths[n]))  # type: ignore[misc]
        assert {g.headers["webhook-id"] for g in got} == {message_id(ids[name], "completed")}
        log = env.wait(
            f"{name} recorded",
            lambda n=name: [d for d in deliveries(env, keys["a"], ids[n]) if d["delivered"]],
        )
        assert [d["attempt"] for d in log] == [1 if name == "never" else 2]
        assert job(env, keys["a"], ids[name])["webhook_status"] == "delivered"
    # delivered now: nothing more to send, even a minute later
    with sessions() as s:
        # only "recent": "stuck" is still pending but was sent again just now (once per
        # RESEND_EVERY_S, not at every sweep)
        assert webhooks.resend_lost(s, renv, now + timedelta(minutes=1)) == 1
    r.close()
    engine.dispose()
    assert env.receiver.at(paths["done"]) == []

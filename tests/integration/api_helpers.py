"""Helpers shared by the API integration tests."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from pydantic import SecretStr

from common.protocol import job_events_key, worker_heartbeat_key
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.tenants import api_keys
from control_plane.settings import Settings
from tests.conftest import S3Server

WORKER_TOKEN = "test-worker-token-0123456789"
WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}
SPEC = {"name": "demo", "model": "store://models/demo/", "scaledown_window_s": 5}


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def deploy(client: TestClient, key: str, **over: Any) -> dict[str, Any]:
    r = client.post("/v1/deployments", json={**SPEC, **over}, headers=h(key))
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def submit(client: TestClient, key: str, **body: Any) -> str:
    """An async job on the `demo` deployment (prompt "x" unless `input` is given); its id."""
    r = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}, **body}, headers=h(key)
    )
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    return job_id


def on_s3(settings: Settings, s3: S3Server, **update: Any) -> Settings:
    """`settings` with the test S3 server as the platform's object store, a secret key for the
    storage credentials tenants register, and `update` (a module's buckets and limits)."""
    secret_key = SecretStr("test-secret-key-for-storage-credentials")
    return settings.model_copy(
        update={"s3_endpoint_url": s3.url, "secret_key": secret_key, **update}
    )


def tenant_keys(database_url: str) -> dict[str, str]:
    """Operator tenant `a` and tenant `b` with admin keys, and a read-only key of `a`:
    {"a", "b", "ro"} -> key."""
    engine = make_engine(database_url)
    now = datetime.now(UTC)
    with make_sessionmaker(engine)() as s:
        a = api_keys.create_tenant(s, "a", now)
        a.is_operator = True
        b = api_keys.create_tenant(s, "b", now)
        s.flush()
        _, key_a = api_keys.create_api_key(s, a.id, {"admin"}, now)
        _, key_b = api_keys.create_api_key(s, b.id, {"admin"}, now)
        _, key_ro = api_keys.create_api_key(s, a.id, {"read"}, now)
        s.commit()
    engine.dispose()
    return {"a": key_a, "b": key_b, "ro": key_ro}


def operator_and_tenants(database_url: str) -> dict[str, dict[str, str]]:
    """Tenants `op` (the operator), `a` and `b`, each with an admin key: name -> {id, key}."""
    engine = make_engine(database_url)
    now = datetime.now(UTC)
    out: dict[str, dict[str, str]] = {}
    with make_sessionmaker(engine)() as s:
        for name in ("op", "a", "b"):
            t = api_keys.create_tenant(s, name, now)
            t.is_operator = name == "op"
            s.flush()
            out[name] = {"id": t.id, "key": api_keys.create_api_key(s, t.id, {"admin"}, now)[1]}
        s.commit()
    engine.dispose()
    return out


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port, in a thread of this process; yields
    "127.0.0.1:<port>" and stops the server at the end."""
    import uvicorn

    from control_plane.embedded.processes import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# Cold starts: a worker's reports and heartbeats as the reconciler reads them.


def starting_events(redis_client: Any, job_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(fields[b"data"])
        for _, fields in redis_client.xrange(job_events_key(job_id))
        if fields[b"type"] == b"starting"
    ]


def past() -> datetime:
    """The tests' time 0: reports the API takes as they are (it never takes one from the
    future), ticks in step with them."""
    return datetime.now(UTC) - timedelta(seconds=60)


def report(client: TestClient, worker_id: str, state: str, at: datetime) -> None:
    r = client.post(
        f"/internal/workers/{worker_id}/state",
        json={"state": state, "at": at.timestamp()},
        headers=WORKER,
    )
    assert r.status_code == 200, r.text


def beat(redis_client: Any, worker_id: str, done: int | None = None, total: int = 0) -> None:
    body: dict[str, Any] = {"worker_id": worker_id, "state": "loading"}
    if done is not None:
        body["progress"] = {"bytes_done": done, "bytes_total": total}
    redis_client.set(worker_heartbeat_key(worker_id), json.dumps(body), ex=10)

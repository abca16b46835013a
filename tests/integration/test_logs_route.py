"""`GET /v1/logs` through the real API (in process, and served by uvicorn for a follow) on a
real Redis and SQL database, reading log files as the embedded platform writes them: a job's,
a worker's and a deployment's lines, nothing of another tenant's, and a follow that streams
new lines until the client goes away."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.db.models import Deployment
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.log_lines import iso
from control_plane.services.workers import worker_records
from control_plane.settings import Settings
from tests.helpers import wait_for
from tests.integration.api_helpers import WORKER, deploy, h, served, submit

NOW = datetime.now(UTC)


@pytest.fixture
def logs_settings(settings: Settings, tmp_path: Path) -> Settings:
    (tmp_path / "logs" / "workers").mkdir(parents=True)
    return settings.model_copy(update={"state_dir": tmp_path})


@pytest.fixture
def api(logs_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(logs_settings)) as c:
        yield c


def _line(at: datetime, message: str, **ids: Any) -> str:
    return json.dumps({"timestamp": iso(at), "level": "INFO", "component": "x",
                       "logger": "t", "message": message, "pid": 1, **ids})  # fmt: skip


def _worker(settings: Settings, tenant_key: str, api: TestClient) -> tuple[str, str]:
    """A worker row of the key's `demo` deployment: (worker id, deployment id)."""
    dep_id = api.get("/v1/deployments/demo", headers=h(tenant_key)).json()["id"]
    sessions = make_sessionmaker(make_engine(settings.database_url))
    with sessions() as session, session.begin():
        dep = session.get(Deployment, dep_id)
        assert dep is not None
        worker_id = worker_records.create(session, dep, "cpu", "test", NOW).id
    return worker_id, dep_id


@pytest.fixture
def world(api: TestClient, logs_settings: Settings, keys: dict[str, str]) -> dict[str, str]:
    """Tenants a and b, each a `demo` deployment, a worker and a job the worker ran; the logs
    of the workers and of the platform processes, as the embedded platform writes them."""
    out: dict[str, str] = {}
    for t in ("a", "b"):
        deploy(api, keys[t])
        out[f"wrk_{t}"], out[f"dep_{t}"] = _worker(logs_settings, keys[t], api)
        out[f"job_{t}"] = submit(api, keys[t])
        claim = {"worker_id": out[f"wrk_{t}"]}
        r = api.post(f"/internal/jobs/{out[f'job_{t}']}/claim", json=claim, headers=WORKER)
        assert r.status_code == 200, r.text
    logs = logs_settings.state_dir / "logs"
    for t in ("a", "b"):
        w, d, j = out[f"wrk_{t}"], out[f"dep_{t}"], out[f"job_{t}"]
        (logs / "workers" / f"{w}.log").write_text("\n".join([
            "python: starting",  # before logging starts: a text line
            _line(NOW, f"{t} booted", worker_id=w, deployment_id=d),
            _line(NOW + timedelta(seconds=2), f"{t} job done", worker_id=w, job_id=j),
        ]) + "\n")  # fmt: skip
    (logs / "api-0.log").write_text("\n".join([
        _line(NOW + timedelta(seconds=1), "request a", job_id=out["job_a"]),
        _line(NOW + timedelta(seconds=1), "request b", job_id=out["job_b"]),
        _line(NOW - timedelta(hours=2), "deployed a", deployment_id=out["dep_a"]),
    ]) + "\n")  # fmt: skip
    (logs / "reconciler.log").write_text(
        _line(NOW + timedelta(seconds=3), "started a", worker_id=out["wrk_a"]) + "\n"
        + _line(NOW + timedelta(seconds=3), "scaled b", deployment_id=out["dep_b"]) + "\n"
    )  # fmt: skip
    return out


def _messages(api: TestClient, key: str, **query: Any) -> list[str]:
    r = api.get("/v1/logs", params=query, headers=h(key))
    assert r.status_code == 200, r.text
    return [line["message"] for line in r.json()["data"]]


def test_a_jobs_lines_come_from_its_workers_and_the_platforms_logs_in_time_order(
    api: TestClient, keys: dict[str, str], world: dict[str, str]
) -> None:
    assert _messages(api, keys["a"], job=world["job_a"]) == ["request a", "a job done"]
    assert _messages(api, keys["b"], job=world["job_b"]) == ["request b", "b job done"]


def test_a_workers_log_is_whole_and_the_platforms_lines_about_it(
    api: TestClient, keys: dict[str, str], world: dict[str, str]
) -> None:
    r = api.get("/v1/logs", params={"worker": world["wrk_a"]}, headers=h(keys["a"]))
    lines = r.json()["data"]
    assert [x["message"] for x in lines] == [
        "python: starting",
        "a booted",
        "a job done",
        "started a",
    ]
    assert lines[0]["raw"] is True and lines[0]["worker_id"] == world["wrk_a"]


def test_a_deployment_reads_its_workers_and_its_platform_lines_since_and_limit(
    api: TestClient, keys: dict[str, str], world: dict[str, str]
) -> None:
    every = _messages(api, keys["a"], deployment="demo")
    # the text line before any timed one has no time: it comes first
    assert every == ["python: starting", "deployed a", "a booted", "a job done"]
    assert _messages(api, keys["a"], deployment="demo", since="1h") == ["a booted", "a job done"]
    since = iso(NOW + timedelta(seconds=1))
    assert _messages(api, keys["a"], deployment="demo", since=since) == ["a job done"]
    r = api.get("/v1/logs", params={"deployment": "demo", "limit": 1}, headers=h(keys["a"]))
    assert [x["message"] for x in r.json()["data"]] == ["a job done"]
    assert r.json()["truncated"] is True


def test_another_tenants_job_worker_or_deployment_is_answered_as_a_missing_one(
    api: TestClient, keys: dict[str, str], world: dict[str, str]
) -> None:
    for param, theirs, missing in (
        ("job", world["job_a"], "job_0000000000000000000000"),
        ("worker", world["wrk_a"], "wrk_0000000000000000000000"),
    ):
        other = api.get("/v1/logs", params={param: theirs}, headers=h(keys["b"]))
        absent = api.get("/v1/logs", params={param: missing}, headers=h(keys["b"]))
        assert other.status_code == absent.status_code == 404
        assert other.json() == json.loads(absent.text.replace(missing, theirs))
    # b's deployment of the same name is b's own: never a's lines
    assert "a booted" not in _messages(api, keys["b"], deployment="demo")
    gone = api.get("/v1/logs", params={"deployment": "nope"}, headers=h(keys["a"]))
    assert gone.status_code == 404


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({}, "exactly one of job, worker or deployment"),
        ({"job": "job_1", "deployment": "demo"}, "exactly one"),
        ({"job": "job_1", "since": "yesterday"}, "neither an ISO 8601 time"),
        ({"job": "job_1", "since": "2025-06-01T10:00:00"}, "no time zone"),
        ({"job": "job_1", "limit": 0}, "limit"),
        ({"job": "job_1", "limit": 10_001}, "limit"),
    ],
)
def test_bad_queries_get_a_problem_naming_what_is_wrong(
    api: TestClient, keys: dict[str, str], query: dict[str, Any], says: str
) -> None:
    r = api.get("/v1/logs", params=query, headers=h(keys["a"]))
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert says in r.text


def test_reading_logs_needs_a_key(api: TestClient) -> None:
    assert api.get("/v1/logs", params={"job": "job_1"}).status_code == 401


def test_following_streams_new_lines_as_ndjson_until_the_client_goes_away(
    logs_settings: Settings, keys: dict[str, str], world: dict[str, str]
) -> None:
    log = logs_settings.state_dir / "logs" / "workers" / f"{world['wrk_a']}.log"
    params = {"job": world["job_a"], "follow": "true"}
    got: list[dict[str, Any]] = []
    with (
        served(create_app(logs_settings)) as addr,
        httpx.Client(base_url=f"http://{addr}", headers=h(keys["a"]), timeout=30) as http,
        http.stream("GET", "/v1/logs", params=params) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        lines = r.iter_lines()

        def next_line() -> dict[str, Any]:
            while not (text := next(lines)).strip():
                pass  # a keep-alive
            line: dict[str, Any] = json.loads(text)
            return line

        got += [next_line(), next_line()]  # the tail first
        assert [x["message"] for x in got] == ["request a", "a job done"]
        later = datetime.now(UTC)
        with log.open("a") as f:
            f.write(_line(later, "a later line", job_id=world["job_a"]) + "\n")
            f.write(_line(later, "not this job's", job_id=world["job_b"]) + "\n")
            f.write(_line(later, "the job again", job_id=world["job_a"]) + "\n")
        got += [next_line(), next_line()]
        assert [x["message"] for x in got[2:]] == ["a later line", "the job again"]
        followers = [t for t in threading.enumerate() if t.name == "log-follow"]
        assert followers
    # the client went away: the API stops reading the logs
    wait_for(lambda: not any(t.is_alive() for t in followers), timeout_s=10)


def test_the_sdk_reads_and_follows_logs_telling_ids_by_their_prefix(
    logs_settings: Settings, keys: dict[str, str], world: dict[str, str]
) -> None:
    from sdk import AsyncClient, Client, NotFoundError

    with served(create_app(logs_settings)) as addr:
        url = f"http://{addr}"
        with Client(base_url=url, api_key=keys["a"]) as client:
            assert [x["message"] for x in client.logs(world["job_a"])] == [
                "request a",
                "a job done",
            ]
            assert client.logs(world["wrk_a"], limit=1)[0]["message"] == "started a"
            since = NOW + timedelta(seconds=1, milliseconds=500)
            assert [x["message"] for x in client.logs("demo", since=since)] == ["a job done"]
            with pytest.raises(NotFoundError):
                client.logs(world["job_b"])  # another tenant's
            with client.logs.follow(world["job_a"], limit=1) as lines:
                assert next(iter(lines))["message"] == "a job done"

        async def follow_async() -> list[str]:
            async with AsyncClient(base_url=url, api_key=keys["a"]) as client:
                tail = await client.logs("demo", since=3600)
                lines = await client.logs.follow("demo", limit=2)
                async with lines:
                    first = [(await lines.__anext__())["message"] for _ in range(2)]
                return [x["message"] for x in tail] + first

        import asyncio

        assert asyncio.run(follow_async()) == [
            "a booted",
            "a job done",
            "a booted",
            "a job done",
        ]


def test_a_workers_failure_reason_is_shown_whole_with_the_tenants_store_paths(
    api: TestClient, logs_settings: Settings, keys: dict[str, str], world: dict[str, str]
) -> None:
    tenant = api.get("/v1/deployments/demo", headers=h(keys["a"])).json()
    internal = f"s3://{logs_settings.store_bucket}/tenants/"
    sessions = make_sessionmaker(make_engine(logs_settings.database_url))
    with sessions() as session:
        dep = session.get(Deployment, tenant["id"])
        assert dep is not None
        prefix = f"{internal}{dep.tenant_id}/"
    tensors = ", ".join(f"model.layers.{i}.mlp.down_proj.weight" for i in range(12))
    reason = f"LoaderError: {prefix}models/demo/model.safetensors: truncated tensors {tensors}"
    assert len(reason) > 400
    r = api.post(
        f"/internal/workers/{world['wrk_a']}/state",
        json={"state": "failed", "at": datetime.now(UTC).timestamp(), "reason": reason},
        headers=WORKER,
    )
    assert r.status_code == 200, r.text
    workers = api.get("/v1/workers", params={"deployment": "demo"}, headers=h(keys["a"])).json()
    shown = next(w["reason"] for w in workers["data"] if w["id"] == world["wrk_a"])
    assert shown == reason.replace(prefix, "store://")
    assert shown.endswith(tensors) and internal not in shown

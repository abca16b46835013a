"""Batches against the real API in process, real Redis (broker), SQL and S3 (rclone).

Jobs are completed through the internal endpoints (no model); the loop's `pump` is called
directly, as the autoscaler loop does every tick.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from common.protocol import RECONCILER_NUDGE_KEY, deployment_queue, job_cancel_key
from control_plane.db.models import Batch, Job
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain import endings
from control_plane.reconcile import batches as batch_reconciler
from control_plane.reconcile.env import Env as ReconcileEnv
from control_plane.services.jobs import batch_slots
from control_plane.services.jobs import finish as finish_
from control_plane.services.jobs.dispatch import make_celery, queue_depth
from control_plane.services.jobs.outbox import Outbox
from control_plane.services.storage import object_store
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import WORKER, deploy, h, on_s3

RESULTS_BUCKET = "results-test"


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    return on_s3(
        settings,
        s3_env,
        results_bucket=RESULTS_BUCKET,
        batch_max_lines=50,
        batch_max_in_flight=8,
        store_bucket="store-batches",
    )


class Db:
    """Direct reads of the test database, and the loop's pump."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = make_engine(settings.database_url)
        self.sessions = make_sessionmaker(self.engine)
        self.celery = make_celery(settings)

    def jobs(self, batch_id: str) -> list[Job]:
        with self.sessions() as s:
            q = select(Job).where(Job.batch_id == batch_id).order_by(Job.batch_index)
            return list(s.scalars(q))

    def count(self, model: type[Any]) -> int:
        with self.sessions() as s:
            return len(list(s.scalars(select(model))))

    def pump(self, redis_client: Any) -> None:
        with self.sessions() as s:
            env = ReconcileEnv(self.settings, redis_client, self.celery, None)  # type: ignore[arg-type]
            batch_reconciler.pump(s, env, datetime.now(UTC))


@pytest.fixture
def db(settings: Settings) -> Iterator[Db]:
    d = Db(settings)
    yield d
    d.engine.dispose()


def finish(client: TestClient, job_id: str, text: str, status: str = "succeeded") -> None:
    r = client.post(f"/internal/jobs/{job_id}/claim", json={"worker_id": "w1"}, headers=WORKER)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = {"worker_id": "w1", "attempt": r.json()["attempt"], "status": status}
    if status == "succeeded":
        body["output"] = {"text": text, "finish_reason": "stop"}
    else:
        body["error"] = {"type": "model_error", "message": text}
    r = client.post(f"/internal/jobs/{job_id}/complete", json=body, headers=WORKER)
    assert r.status_code == 200, r.text


def create(client: TestClient, key: str, body: dict[str, Any], **headers: str) -> Any:
    return client.post("/v1/batches", json={"deployment": "demo", **body}, headers=h(key) | headers)


def test_bounded_fan_out_then_results_in_object_storage(
    client: TestClient, keys: dict[str, str], db: Db, redis_client: Any
) -> None:
    dep = deploy(client, keys["a"], defaults={"max_tokens": 7})
    inputs = [{"prompt": f"p{i}"} for i in range(5)]
    r = create(client, keys["a"], {"inputs": inputs, "max_in_flight": 2})
    assert r.status_code == 201, r.text
    batch = r.json()
    assert batch["status"] == "running" and batch["total"] == 5
    assert batch["counts"]["queued"] == 5 and batch["max_in_flight"] == 2
    queue = deployment_queue(dep["id"])

    rows = db.jobs(batch["id"])
    assert [j.batch_index for j in rows] == [0, 1, 2, 3, 4]
    assert [j.dispatched_at is not None for j in rows] == [True, True, False, False, False]
    assert {j.kind for j in rows} == {"batch"}
    assert rows[0].input["max_tokens"] == 7, "deployment defaults fill the inputs"
    assert queue_depth(db.celery, queue) == 2

    db.pump(redis_client)  # nothing is free yet
    assert queue_depth(db.celery, queue) == 2
    # A line's end hands its slot to the next line at once, in input order: no pump between.
    finish(client, rows[0].id, "r0")
    rows = db.jobs(batch["id"])
    assert [j.dispatched_at is not None for j in rows] == [True, True, True, False, False]
    assert queue_depth(db.celery, queue) == 3
    finish(client, rows[1].id, "r1", status="failed")
    rows = db.jobs(batch["id"])
    assert [j.dispatched_at is not None for j in rows] == [True, True, True, True, False]
    assert queue_depth(db.celery, queue) == 4
    db.pump(redis_client)  # both slots are taken: the pump adds nothing
    assert queue_depth(db.celery, queue) == 4
    finish(client, rows[2].id, "r2")
    assert queue_depth(db.celery, queue) == 5
    assert client.get(f"/v1/batches/{batch['id']}", headers=h(keys["a"])).json()["counts"] == {
        "queued": 2,
        "starting": 0,
        "running": 0,
        "succeeded": 2,
        "failed": 1,
        "canceled": 0,
        "expired": 0,
        "timed_out": 0,
    }
    for j in rows[3:]:
        finish(client, j.id, f"r{j.batch_index}")
    db.pump(redis_client)

    done = client.get(f"/v1/batches/{batch['id']}", headers=h(keys["a"])).json()
    assert done["status"] == "completed" and done["completed_at"] is not None
    tenant = db.jobs(batch["id"])[0].tenant_id
    assert done["results_uri"] == f"s3://{RESULTS_BUCKET}/batches/{tenant}/{batch['id']}.jsonl"
    stored = b"".join(object_store.open_chunks(db.settings, done["results_uri"]))
    lines = [json.loads(x) for x in stored.decode().splitlines()]
    expected = [
        {
            "index": j.batch_index,
            "job_id": j.id,
            "status": j.status,
            "output": j.output,
            "error": j.error,
        }
        for j in db.jobs(batch["id"])
    ]
    assert lines == expected
    assert [x["status"] for x in lines] == ["succeeded", "failed", *["succeeded"] * 3]
    assert lines[4]["output"]["text"] == "r4" and lines[1]["error"]["message"] == "r1"
    r = client.get(f"/v1/batches/{batch['id']}/results", headers=h(keys["a"]))
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/jsonl")
    assert r.content == stored
    db.pump(redis_client)  # a completed batch is left alone
    assert db.count(Batch) == 1


def test_only_a_line_that_held_a_slot_hands_one_on(
    client: TestClient, keys: dict[str, str], db: Db, redis_client: Any
) -> None:
    """A waiting line that ends (its ttl passed, canceled) held no slot: the batch's in-flight
    count stays at max_in_flight; and lines ended together hand on as many slots as they
    held, to the next lines in input order."""
    dep = deploy(client, keys["a"])
    inputs = [{"prompt": f"p{i}"} for i in range(6)]
    bid = create(client, keys["a"], {"inputs": inputs, "max_in_flight": 2}).json()["id"]
    rows = db.jobs(bid)
    queue = deployment_queue(dep["id"])
    assert queue_depth(db.celery, queue) == 2
    outbox = Outbox(redis_client, db.celery)
    now = datetime.now(UTC)
    with db.sessions() as s:  # line 2 waits and ends: nothing is handed on
        finish_.finish(s, outbox, [(rows[2].id, endings.canceled("test"))], now)
    assert [j.dispatched_at is not None for j in db.jobs(bid)] == [True, True] + [False] * 4
    assert queue_depth(db.celery, queue) == 2
    with db.sessions() as s:  # lines 0 and 1 end together: lines 3 and 4 get their slots
        ending = endings.canceled("test")
        finish_.finish(s, outbox, [(rows[0].id, ending), (rows[1].id, ending)], now)
    after = db.jobs(bid)
    assert [j.dispatched_at is not None for j in after] == [True] * 2 + [False] + [True] * 2 + [
        False
    ]
    assert [j.status for j in after][3:] == ["queued"] * 3
    assert queue_depth(db.celery, queue) == 4


def test_the_end_of_a_batch_s_last_line_nudges_the_loop_to_complete_it(
    client: TestClient, keys: dict[str, str], db: Db, redis_client: Any
) -> None:
    """The pump completes a batch (it writes the results file); the report that ends its last
    running line, with none waiting, nudges the loop to tick now instead of a tick later.
    No line before the last nudges it."""
    deploy(client, keys["a"])
    bid = create(client, keys["a"], {"inputs": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}],
                                     "max_in_flight": 2}).json()["id"]  # fmt: skip
    rows = db.jobs(bid)
    finish(client, rows[0].id, "r0")  # hands its slot to line 2
    redis_client.delete(RECONCILER_NUDGE_KEY)  # (line 2's arrival at a deployment at zero)
    finish(client, rows[1].id, "r1")  # line 2 still runs
    assert redis_client.llen(RECONCILER_NUDGE_KEY) == 0
    finish(client, rows[2].id, "r2")
    assert redis_client.lrange(RECONCILER_NUDGE_KEY, 0, -1) == [b"1"]
    db.pump(redis_client)
    assert client.get(f"/v1/batches/{bid}", headers=h(keys["a"])).json()["status"] == "completed"


def test_lines_ended_at_once_by_two_transactions_hand_on_distinct_slots(
    client: TestClient, keys: dict[str, str], db: Db, redis_client: Any
) -> None:
    """Two transactions each end a line of one batch and hand its slot on while both are open
    (two API processes): they give the slots to two different lines, never one line twice and
    never more than were freed."""
    deploy(client, keys["a"])
    inputs = [{"prompt": f"p{i}"} for i in range(5)]
    bid = create(client, keys["a"], {"inputs": inputs, "max_in_flight": 2}).json()["id"]
    rows = db.jobs(bid)
    now = datetime.now(UTC)
    # SQLite has one writer at a time: there the second transaction begins once the first
    # committed, and only PostgreSQL has both open at once
    one_writer = db.settings.database_url.startswith("sqlite")
    first, second = db.sessions(), db.sessions()
    try:
        taken = []
        for session, row in ((first, rows[0]), (second, rows[1])):
            if session is second and one_writer:
                first.commit()
            ended = session.get(Job, row.id)
            assert ended is not None
            ended.status = "canceled"  # written in this transaction, which stays open
            session.flush()
            handover = batch_slots.hand_over(session, [ended], now)
            taken += handover.woken.get(rows[0].deployment_id, [])
        first.commit()
        second.commit()
    finally:
        first.close()
        second.close()
    assert sorted(taken) == sorted([rows[2].id, rows[3].id])
    assert [j.dispatched_at is not None for j in db.jobs(bid)] == [True] * 4 + [False]


def test_jsonl_text_and_s3_object_inputs(
    client: TestClient, keys: dict[str, str], db: Db, s3_env: S3Server
) -> None:
    deploy(client, keys["a"])
    jsonl = '{"prompt": "a"}\n\n{"prompt": "b", "max_tokens": 3}\n'
    r = create(client, keys["a"], {"input_jsonl": jsonl})
    assert r.status_code == 201, r.text
    assert [j.input["prompt"] for j in db.jobs(r.json()["id"])] == ["a", "b"]
    assert db.jobs(r.json()["id"])[1].input["max_tokens"] == 3

    # A file of the tenant's namespace, uploaded through the API.
    up = client.put("/v1/files/in/batch.jsonl", content=b'{"prompt": "x"}\n{"prompt": "y"}',
                    headers=h(keys["a"]))  # fmt: skip
    assert up.status_code == 201, up.text
    assert up.json()["uri"] == "store://in/batch.jsonl"
    r = create(client, keys["a"], {"input_uri": "store://in/batch.jsonl", "max_in_flight": 1})
    assert r.status_code == 201, r.text
    assert r.json()["input_uri"] == "store://in/batch.jsonl"
    assert [j.input["prompt"] for j in db.jobs(r.json()["id"])] == ["x", "y"]


# (request body, line number named, field named) of requests that must be refused whole.
BAD_BATCHES: list[tuple[dict[str, Any], int | None, str]] = [
    (
        {"inputs": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "max_tokens": 0}]},
        3,
        "max_tokens",
    ),
    ({"inputs": [{"prompt": "a", "bogus": 1}]}, 1, "bogus"),
    ({"inputs": ["just text"]}, 1, "inputs"),
    ({"input_jsonl": '{"prompt": "a"}\n{"prompt": \n'}, 2, "input_jsonl"),
    ({"input_jsonl": '{"prompt": "a"}\n\n{"temperature": 0.5}'}, 3, "prompt"),
    ({"inputs": []}, None, "inputs"),
    ({"inputs": [{"prompt": "a"}], "input_jsonl": "{}"}, None, "body"),
    ({}, None, "body"),
    ({"inputs": [{"prompt": "a"}], "max_in_flight": 0}, None, "max_in_flight"),
    ({"inputs": [{"prompt": "a"}], "max_in_flight": 9}, None, "max_in_flight"),
    ({"inputs": [{"prompt": "a"}] * 51}, None, "inputs"),
    ({"input_uri": "s3://test/missing.jsonl"}, None, "input_uri"),
    ({"input_uri": "file:///etc/passwd"}, None, "input_uri"),
    ({"input_uri": f"s3://{RESULTS_BUCKET}/batches/ten_other/x.jsonl"}, None, "input_uri"),
    ({"inputs": [{"prompt": "a"}], "webhook": "http://127.0.0.1:9/x"}, None, "webhook"),
]


def test_bad_input_is_422_naming_line_and_field_and_writes_nothing(
    client: TestClient, keys: dict[str, str], db: Db
) -> None:
    # One database for all cases (each would otherwise pay for a migration).
    deploy(client, keys["a"])
    for body, line, field in BAD_BATCHES:
        r = create(client, keys["a"], body)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        err = r.json()["errors"][0]
        assert err["field"] == field, (body, r.json())
        if line is not None:
            assert err["line"] == line and f"line {line}" in r.json()["detail"], r.json()
        assert db.count(Batch) == 0 and db.count(Job) == 0, body


def test_auth_scope_and_unknown_deployment(client: TestClient, keys: dict[str, str]) -> None:
    body = {"deployment": "demo", "inputs": [{"prompt": "a"}]}
    assert client.post("/v1/batches", json=body).status_code == 401
    deploy(client, keys["a"])
    r = client.post("/v1/batches", json=body, headers=h(keys["ro"]))
    assert r.status_code == 403 and "run" in r.json()["detail"]
    r = client.post("/v1/batches", json={**body, "deployment": "nope"}, headers=h(keys["a"]))
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    assert client.get("/v1/batches/bat_nothere", headers=h(keys["a"])).status_code == 404


def test_idempotent_creation(client: TestClient, keys: dict[str, str], db: Db) -> None:
    deploy(client, keys["a"])
    body = {"inputs": [{"prompt": "a"}, {"prompt": "b"}]}
    first = create(client, keys["a"], body, **{"Idempotency-Key": "batch-1"})
    again = create(client, keys["a"], body, **{"Idempotency-Key": "batch-1"})
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = create(
        client, keys["a"], {"inputs": [{"prompt": "c"}]}, **{"Idempotency-Key": "batch-1"}
    )
    assert other.status_code == 409
    # The same key from another tenant is another batch.
    deploy(client, keys["b"])
    theirs = create(client, keys["b"], body, **{"Idempotency-Key": "batch-1"})
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    assert db.count(Batch) == 2 and db.count(Job) == 4


def test_tenant_isolation(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    bid = create(client, keys["a"], {"inputs": [{"prompt": "a"}]}).json()["id"]
    for method, path in [
        ("GET", f"/v1/batches/{bid}"),
        ("POST", f"/v1/batches/{bid}/cancel"),
        ("GET", f"/v1/batches/{bid}/results"),
        ("GET", f"/v1/batches/{bid}/webhook/deliveries"),
    ]:
        assert client.request(method, path, headers=h(keys["b"])).status_code == 404, path
    assert client.get("/v1/batches", headers=h(keys["b"])).json()["data"] == []
    # Tenant B cannot run a batch on tenant A's deployment either.
    assert create(client, keys["b"], {"inputs": [{"prompt": "a"}]}).status_code == 404


def test_cancel_stops_pending_and_flags_running_jobs(
    client: TestClient, keys: dict[str, str], db: Db, redis_client: Any
) -> None:
    deploy(client, keys["a"])
    bid = create(client, keys["a"], {"inputs": [{"prompt": str(i)} for i in range(4)]}).json()["id"]
    rows = db.jobs(bid)
    finish(client, rows[0].id, "done")
    claim = client.post(
        f"/internal/jobs/{rows[1].id}/claim", json={"worker_id": "w"}, headers=WORKER
    )
    assert claim.status_code == 200

    r = client.post(f"/v1/batches/{bid}/cancel", headers=h(keys["a"]))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "canceled"
    assert r.json()["counts"]["canceled"] == 3 and r.json()["counts"]["succeeded"] == 1
    assert redis_client.get(job_cancel_key(rows[1].id)) == b"1"
    # The running job's late report is refused; pending jobs can no longer be claimed.
    late = {"worker_id": "w", "attempt": 1, "status": "succeeded", "output": {"text": "x"}}
    assert (
        client.post(f"/internal/jobs/{rows[1].id}/complete", json=late, headers=WORKER).status_code
        == 409
    )
    assert (
        client.post(
            f"/internal/jobs/{rows[2].id}/claim", json={"worker_id": "w"}, headers=WORKER
        ).status_code
        == 409
    )
    assert client.post(f"/v1/batches/{bid}/cancel", headers=h(keys["a"])).status_code == 200
    assert client.post(f"/v1/batches/{bid}/cancel", headers=h(keys["ro"])).status_code == 403
    # Results of a canceled batch come from the database: every job, in input order.
    r = client.get(f"/v1/batches/{bid}/results", headers=h(keys["a"]))
    assert r.headers["x-batch-status"] == "canceled"
    assert [json.loads(x)["status"] for x in r.text.splitlines()] == ["succeeded"] + [
        "canceled"
    ] * 3
    db.pump(redis_client)
    assert client.get(f"/v1/batches/{bid}", headers=h(keys["a"])).json()["status"] == "canceled"


def test_completed_batch_cannot_be_canceled(
    client: TestClient, keys: dict[str, str], db: Db, redis_client: Any
) -> None:
    deploy(client, keys["a"])
    bid = create(client, keys["a"], {"inputs": [{"prompt": "a"}]}).json()["id"]
    finish(client, db.jobs(bid)[0].id, "x")
    db.pump(redis_client)
    r = client.post(f"/v1/batches/{bid}/cancel", headers=h(keys["a"]))
    assert r.status_code == 409 and "completed" in r.json()["detail"]


def test_partial_results_while_running(client: TestClient, keys: dict[str, str], db: Db) -> None:
    deploy(client, keys["a"])
    bid = create(
        client, keys["a"], {"inputs": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]}
    ).json()["id"]
    rows = db.jobs(bid)
    finish(client, rows[1].id, "second")
    r = client.get(f"/v1/batches/{bid}/results", headers=h(keys["a"]))
    assert r.status_code == 200 and r.headers["x-batch-status"] == "running"
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert lines == [
        {
            "index": 1,
            "job_id": rows[1].id,
            "status": "succeeded",
            "output": {"text": "second", "finish_reason": "stop"},
            "error": None,
        }
    ]


def test_list_paginates_newest_first(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"])
    ids = [
        create(client, keys["a"], {"inputs": [{"prompt": str(i)}]}).json()["id"] for i in range(5)
    ]
    got: list[str] = []
    cursor = ""
    while True:
        page = client.get(f"/v1/batches?limit=2&cursor={cursor}", headers=h(keys["a"])).json()
        got += [b["id"] for b in page["data"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert got == list(reversed(ids))
    running = client.get("/v1/batches?status=completed", headers=h(keys["a"])).json()
    assert running["data"] == []

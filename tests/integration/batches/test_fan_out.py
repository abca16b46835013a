"""A batch's fan-out: at most max_in_flight of its jobs queued at once, each ended line handing
its slot on (only a line that held one, distinct slots for lines ended at once), the loop nudged
by the last line, and the results written to object storage."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fastapi.testclient import TestClient

from common.protocol import RECONCILER_NUDGE_KEY, deployment_queue
from control_plane.db.models import Batch, Job
from control_plane.domain import endings
from control_plane.services.jobs import batch_slots
from control_plane.services.jobs import finish as finish_
from control_plane.services.jobs.dispatch import queue_depth
from control_plane.services.jobs.outbox import Outbox
from control_plane.services.storage import object_store
from tests.integration.api_helpers import deploy, h
from tests.integration.batches.helpers import RESULTS_BUCKET, Db, create, finish


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

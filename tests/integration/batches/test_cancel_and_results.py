"""A running batch: cancel (pending jobs stopped, running ones flagged; a completed batch cannot
be), partial results while it runs, and listing newest first."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from common.protocol import job_cancel_key
from tests.integration.api_helpers import WORKER, deploy, h
from tests.integration.batches.helpers import Db, create, finish


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

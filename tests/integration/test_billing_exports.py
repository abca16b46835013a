"""Billing exports and summaries through the API (SQLite and PostgreSQL): CSV and JSONL, usage
summaries by every grouping adding up to the records, the drift metric, and who may read them."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

from fastapi.testclient import TestClient

from control_plane.reconcile.driver import Reconciler
from control_plane.settings import Settings
from tests.integration.api_helpers import h
from tests.integration.billing_helpers import claim, complete, records, report, start_worker
from tests.integration.conftest import SteppedClock


def test_exports_and_summaries(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    settings: Settings,
    clock: SteppedClock,
) -> None:
    key = keys["a"]
    wid = start_worker(client, clock, key, loop)
    jid = client.get("/v1/jobs", headers=h(key)).json()["data"][0]["id"]
    report(client, clock, wid, "busy")
    complete(client, jid, wid, claim(client, jid, wid), prompt=1, gen=1)
    report(client, clock, wid, "idle")
    loop.tick(clock())

    csv_text = client.get("/v1/billing/records?format=csv", headers=h(key)).text
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    assert [r["phase"] for r in rows] == [r["phase"] for r in records(client, key)]
    jsonl = client.get("/v1/usage?format=jsonl", headers=h(key)).text.splitlines()
    assert json.loads(jsonl[0])["job_id"] == jid

    total = sum(Decimal(r["amount"]) for r in records(client, key))
    for group_by in ("deployment", "day", "hour", "phase", "api_key"):
        s = client.get(f"/v1/usage/summary?group_by={group_by}", headers=h(key)).json()
        assert Decimal(s["total_amount"]) == total, group_by
    by_phase = client.get("/v1/usage/summary?group_by=phase", headers=h(key)).json()["data"]
    assert {g["group"] for g in by_phase} >= {"boot", "load", "warm", "idle", "busy"}
    bad = client.get("/v1/usage/summary?group_by=color", headers=h(key))
    assert bad.status_code == 422
    assert client.get("/v1/usage", headers=h(keys["b"])).json()["data"] == []
    metrics = client.get("/metrics", headers=h(key)).text
    assert "platform_billing_drift_issues 0" in metrics
    # platform-wide numbers: the operator's admin keys only
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=h(keys["b"])).status_code == 403
    assert client.get("/metrics", headers=h(keys["ro"])).status_code == 403

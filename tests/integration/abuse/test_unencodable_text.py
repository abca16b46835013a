"""Text that cannot be encoded as UTF-8 (a lone surrogate, `"\\ud800"`: valid JSON, not valid
Unicode text) is refused with 422 wherever a tenant's string enters, before anything is
stored; on the OpenAI routes with their own error shape. A row such a string reached through
older code no longer breaks the routes that list it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.integration.abuse.conftest import Rows, send
from tests.integration.api_helpers import SPEC, WORKER, deploy, h, submit

LONE = "\ud800"  # a high surrogate with no low one after it
LOW = "\udfff"  # a low surrogate with no high one before it
JOBS = "/v1/deployments/demo/jobs"
CREDENTIAL = {"bucket": "tenant-bucket", "access_key_id": "AKIA1", "secret_access_key": "s"}

# (method, path, body, the field the answer names)
CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("POST", JOBS, {"input": {"prompt": "hi" + LONE}}, "input.prompt"),
    ("POST", JOBS, {"input": {"prompt": "hi", "stop": ["ok", LONE]}}, "input.stop.1"),
    ("POST", JOBS, {"input": {"prompt": "hi"}, "webhook": "https://x.example/" + LONE}, "webhook"),
    ("POST", "/v1/deployments/demo/run", {"input": {"prompt": "hi", "stop": [LOW]}},
     "input.stop.0"),
    ("POST", "/v1/deployments", {**SPEC, "name": "x", "defaults": {"stop": [LONE]}},
     "defaults.stop.0"),
    ("POST", "/v1/deployments", {**SPEC, "name": "x" + LONE}, "name"),
    ("POST", "/v1/deployments", {**SPEC, "name": "x", "model": "store://m/" + LONE}, "model"),
    ("PUT", "/v1/deployments/demo", {**SPEC, "defaults": {"stop": ["a" + LONE]}},
     "defaults.stop.0"),
    ("POST", "/v1/batches", {"deployment": "demo", "inputs": [{"prompt": "a"}, {"prompt": LONE}]},
     "prompt"),
    ("POST", "/v1/batches", {"deployment": "demo", "input_jsonl": '{"prompt": "a' + LONE + '"}'},
     "input_jsonl"),
    ("POST", "/v1/batches", {"deployment": "demo", "inputs": [{"prompt": "a"}],
                             "webhook": "https://x.example/" + LONE}, "webhook"),
    ("POST", "/v1/batches", {"deployment": "demo" + LONE, "inputs": [{"prompt": "a"}]},
     "deployment"),
    ("POST", "/v1/webhooks/endpoints", {"url": "https://x.example/" + LONE}, "url"),
    ("POST", "/v1/keys", {"name": "ci" + LONE}, "name"),
    ("POST", "/v1/keys", {"scopes": ["run" + LONE]}, "scopes.0"),
    ("POST", "/v1/tenants", {"name": "t" + LONE}, "name"),
    *[
        ("POST", "/v1/storage-credentials", {**CREDENTIAL, field: "x" + LONE}, field)
        for field in ("bucket", "access_key_id", "secret_access_key", "endpoint_url", "region")
    ],
]  # fmt: skip

OPENAI_CASES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": LONE}]}),
    ("/v1/chat/completions", {"model": "demo", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a" + LONE}]}]}),
    ("/v1/chat/completions", {"model": "demo", "stop": LONE,
                              "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "demo", "prompt": LONE}),
    ("/v1/completions", {"model": "demo", "prompt": [LOW]}),
    ("/v1/completions", {"model": "demo", "prompt": "hi", "stop": ["a", LONE]}),
    ("/v1/completions", {"model": "demo" + LONE, "prompt": "hi"}),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "field"), CASES)
def test_a_lone_surrogate_is_refused_before_anything_is_stored(
    client: TestClient,
    keys: dict[str, str],
    rows: Rows,
    method: str,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    deploy(client, keys["a"])
    before = rows.counts()
    r = send(client, method, path, body, keys["a"])
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert any(e["field"].endswith(field) for e in problem["errors"]), problem
    assert "UTF-8" in problem["detail"]
    assert rows.counts() == before


@pytest.mark.parametrize(("path", "body"), OPENAI_CASES)
def test_the_openai_routes_refuse_it_in_their_own_shape(
    client: TestClient, keys: dict[str, str], rows: Rows, path: str, body: dict[str, Any]
) -> None:
    deploy(client, keys["a"])
    before = rows.counts()
    r = send(client, "POST", path, body, keys["a"])
    assert r.status_code == 400, r.text  # what these routes answer for any invalid field
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "UTF-8" in error["message"]
    assert rows.counts() == before


def test_a_batch_line_read_from_object_storage_is_refused(
    client: TestClient, keys: dict[str, str], rows: Rows
) -> None:
    deploy(client, keys["a"])
    # the escape is plain ASCII in the object: the line is valid JSON, its text is not Unicode
    lines = json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b" + LONE}) + "\n"
    r = client.put("/v1/files/in.jsonl", content=lines.encode(), headers=h(keys["a"]))
    assert r.status_code == 201, r.text
    before = rows.counts()
    body = {"deployment": "demo", "input_uri": "store://in.jsonl"}
    r = send(client, "POST", "/v1/batches", body, keys["a"])
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["errors"][0]["line"] == 2 and problem["errors"][0]["field"] == "prompt"
    assert "UTF-8" in problem["detail"]
    assert rows.counts() == before


def test_escaped_text_that_is_valid_unicode_is_accepted(
    client: TestClient, keys: dict[str, str]
) -> None:
    """A surrogate pair is one character (here an emoji), and the other escapes are text."""
    deploy(client, keys["a"])
    prompt = "\U0001f600 caf\u00e9 \u2028 \x00 end"
    r = send(client, "POST", JOBS, {"input": {"prompt": prompt, "stop": ["\U0001f600"]}}, keys["a"])
    assert r.status_code == 202, r.text
    job = client.get(f"/v1/jobs/{r.json()['id']}", headers=h(keys["a"])).json()
    assert job["input"]["prompt"] == prompt and job["input"]["stop"] == ["\U0001f600"]


def test_rows_stored_by_older_code_are_listed_with_replacement_characters(
    client: TestClient, keys: dict[str, str], rows: Rows
) -> None:
    """A job input and a deployment's defaults that reached the database before the edge
    refused them (written here in SQL, as JSON text with the escape) are answered with U+FFFD
    in place of the surrogate: the lists, the reads and the worker's claim all work."""
    dep = deploy(client, keys["a"])
    job_id = submit(client, keys["a"])
    bad_input = '{"prompt": "x\\ud800y", "stop": ["\\udfff"], "max_tokens": 4}'
    with rows.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET input = :i WHERE id = :id"), {"i": bad_input, "id": job_id}
        )
        spec = conn.execute(
            text("SELECT spec FROM deployments WHERE id = :id"), {"id": dep["id"]}
        ).scalar_one()
        doc = json.loads(spec) if isinstance(spec, str) else spec
        doc["defaults"] = {"stop": ["\ud800"]}
        conn.execute(
            text("UPDATE deployments SET spec = :s WHERE id = :id"),
            {"s": json.dumps(doc), "id": dep["id"]},
        )
    listed = client.get("/v1/jobs", headers=h(keys["a"]))
    assert listed.status_code == 200, listed.text
    assert listed.json()["data"][0]["input"]["prompt"] == "x\ufffdy"
    one = client.get(f"/v1/jobs/{job_id}", headers=h(keys["a"]))
    assert one.status_code == 200 and one.json()["input"]["stop"] == ["\ufffd"]
    deps = client.get("/v1/deployments", headers=h(keys["a"]))
    assert deps.status_code == 200, deps.text
    assert deps.json()["data"][0]["defaults"]["stop"] == ["\ufffd"]
    assert client.get("/v1/deployments/demo", headers=h(keys["a"])).status_code == 200
    assert client.get("/v1/models", headers=h(keys["a"])).status_code == 200
    claim = client.post(f"/internal/jobs/{job_id}/claim", json={"worker_id": "w1"}, headers=WORKER)
    assert claim.status_code == 200, claim.text
    assert claim.json()["input"]["prompt"] == "x\ufffdy"

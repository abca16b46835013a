"""The body limit counts the bytes received over real HTTP: a chunked body (no Content-Length)
past the limit gets 413 problem+json and creates nothing; the connection pool stays usable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx


def chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    yield b'{"input": {"prompt": "'
    sent = 0
    while sent < total:
        yield b"x" * size
        sent += size
    yield b'"}}'


def test_chunked_body_over_the_limit_is_413(platform: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {platform['api_key']}", "Content-Type": "application/json"}
    with httpx.Client(base_url=platform["url"], headers=headers, timeout=30) as client:
        before = client.get("/v1/jobs").json()["data"]
        r = client.post("/v1/deployments/anything/jobs", content=chunks(3_000_000))
        assert r.status_code == 413
        assert r.headers["content-type"].startswith("application/problem+json")
        body = r.json()
        assert body["limit_bytes"] == 1_000_000 and "passed" in body["detail"]
        # a declared size over the limit is refused before the body is read
        r = client.post(
            "/v1/deployments/anything/jobs",
            content=b"{" + b" " * 2_000_000 + b"}",
            headers={"Content-Length": str(2_000_002)},
        )
        assert r.status_code == 413
        # nothing was created, and the same client goes on working
        assert client.get("/v1/jobs").json()["data"] == before
        assert client.get("/healthz").status_code == 200


def test_deeply_nested_json_is_refused_on_every_route(platform: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {platform['api_key']}", "Content-Type": "application/json"}
    deep = b'{"input": {"prompt": "hi", "metadata": ' + b"[" * 500 + b"]" * 500 + b"}}"
    with httpx.Client(base_url=platform["url"], headers=headers, timeout=30) as client:
        for path in ("/v1/deployments/anything/jobs", "/v1/chat/completions", "/v1/deployments"):
            r = client.post(path, content=deep)
            # OpenAI's routes answer invalid input as OpenAI does: 400, its error object
            openai = path == "/v1/chat/completions"
            assert r.status_code == (400 if openai else 422), (path, r.text)
            assert "nests 502 levels" in r.text
            assert ("error" in r.json()) is openai
        # without a content type (FastAPI parses it as JSON all the same)
        bare = client.post("/v1/deployments", content=deep, headers={"Content-Type": ""})
        assert bare.status_code == 422, bare.text


def test_an_inline_batch_has_its_own_larger_limit(platform: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {platform['api_key']}", "Content-Type": "application/json"}
    line = b'{\\"prompt\\": \\"' + b"y" * 1000 + b'\\"}\\n'
    body = b'{"deployment": "no-such-deployment", "input_jsonl": "' + line * 2000 + b'"}'
    assert 1_000_000 < len(body) < 50_000_000
    with httpx.Client(base_url=platform["url"], headers=headers, timeout=30) as client:
        r = client.post("/v1/batches", content=iter([body]))  # chunked
        # past the general limit, within the batch limit: read and answered on its merits
        assert r.status_code == 404, r.text
        assert client.post("/v1/deployments/x/jobs", content=iter([body])).status_code == 413


def test_request_heads_are_bounded(platform: dict[str, Any]) -> None:
    """`platform up`'s API processes serve with the header limits (api/server.py)."""
    headers = {"Authorization": f"Bearer {platform['api_key']}"}
    with httpx.Client(base_url=platform["url"], headers=headers, timeout=30) as client:
        r = client.get("/v1/jobs", headers={"X-Big": "a" * 1_000_000})
        assert r.status_code == 431, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        r = client.get("/v1/jobs", headers=[(f"x-h{i}", "1") for i in range(2_000)])
        assert r.status_code == 431, r.text
        assert client.get("/v1/jobs").status_code == 200


def test_the_embedded_stores_buckets_cannot_be_registered(platform: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {platform['api_key']}"}
    body = {"bucket": "models", "access_key_id": "AKIA1", "secret_access_key": "s"}
    with httpx.Client(base_url=platform["url"], headers=headers, timeout=30) as client:
        r = client.post("/v1/storage-credentials", json=body)
        assert r.status_code == 422, r.text
        assert "is the platform's own bucket" in r.json()["detail"]
        assert client.get("/v1/storage-credentials").json()["data"] == []

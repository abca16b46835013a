"""The API reads the model's config and tokenizer to refuse prompts that cannot fit, before
anything is written (no worker needed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from control_plane.settings import Settings
from tests.integration.api_helpers import deploy, h
from worker.model.demo import create_demo_model


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The operator (tenant A) deploys from host paths here, which needs the setting."""
    return settings.model_copy(update={"allow_host_paths": True})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_demo_model(tmp_path_factory.mktemp("m") / "demo", train_steps=0)


def test_prompt_too_long_is_422_with_counts(
    client: TestClient, keys: dict[str, str], model_dir: Path
) -> None:
    deploy(client, keys["a"], model=str(model_dir))
    r = client.post(
        "/v1/deployments/demo/jobs",
        json={"input": {"prompt": "word " * 600, "max_tokens": 8}},
        headers=h(keys["a"]),
    )
    assert r.status_code == 422
    body = r.json()
    assert body["limit"] == 512 and body["max_tokens"] == 8 and body["prompt_tokens"] > 504
    assert body["errors"][0]["field"] == "input.prompt"
    assert client.get("/v1/jobs", headers=h(keys["a"])).json()["data"] == []
    ok = client.post(
        "/v1/deployments/demo/jobs",
        json={"input": {"prompt": "word", "max_tokens": 8}},
        headers=h(keys["a"]),
    )
    assert ok.status_code == 202


def test_a_deploy_reads_the_tokenizer_ahead_of_the_first_call(
    client: TestClient, keys: dict[str, str], model_dir: Path
) -> None:
    dep = deploy(client, keys["a"], model=str(model_dir))
    cache = client.app.state.ctx.model_meta  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while (dep["id"], dep["version"]) not in cache._entries:
        assert time.monotonic() < deadline, "the deploy did not prefetch the model's metadata"
        time.sleep(0.05)
    # the first call finds it read: the same object, no second read
    meta = cache._entries[(dep["id"], dep["version"])]
    assert cache.get(dep["id"], dep["version"], "", "/unused") is meta
    assert meta.max_context == 512


def test_max_tokens_beyond_context(
    client: TestClient, keys: dict[str, str], model_dir: Path
) -> None:
    deploy(client, keys["a"], model=str(model_dir))
    r = client.post(
        "/v1/deployments/demo/run",
        json={"input": {"prompt": "hi", "max_tokens": 600}},
        headers=h(keys["a"]),
    )
    assert r.status_code == 422 and r.json()["limit"] == 512


def test_unreadable_model_does_not_block_the_edge(client: TestClient, keys: dict[str, str]) -> None:
    deploy(client, keys["a"], model="/nonexistent/model")
    r = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "hi"}}, headers=h(keys["a"])
    )
    assert r.status_code == 202  # the worker reports the real problem


def test_openai_errors_have_openai_shape(client: TestClient, keys: dict[str, str]) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        headers=h(keys["a"]),
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = client.post(
        "/v1/chat/completions", json={"model": "x", "messages": []}, headers=h(keys["a"])
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.get("/v1/models")
    assert r.status_code == 401 and "error" in r.json()


def test_a_non_text_chat_part_is_a_400_and_the_connection_stays_usable(
    client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"])
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    r = client.post(
        "/v1/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": [image]}]},
        headers=h(keys["a"]),
    )
    assert r.status_code == 400, r.text
    assert "image_url" in r.json()["error"]["message"]
    assert client.get("/v1/jobs", headers=h(keys["a"])).json()["data"] == [], "no job"


def test_a_deeply_nested_batch_line_is_a_422_naming_the_line(
    client: TestClient, keys: dict[str, str]
) -> None:
    deploy(client, keys["a"])
    nested = "[" * 100_000 + "]" * 100_000
    lines = '{"prompt": "ok"}\n' + nested + "\n"
    r = client.post(
        "/v1/batches", json={"deployment": "demo", "input_jsonl": lines}, headers=h(keys["a"])
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [
        {"line": 2, "field": "input_jsonl", "message": "JSON nested too deeply"}
    ]
    assert client.get("/v1/batches", headers=h(keys["a"])).json()["data"] == []

"""A deployment's engine, chosen at deploy time against the real API, SQL, Redis and S3 server
(rclone), from the checkpoint's real config.json: `auto` takes the built-in engine where it
can and vLLM otherwise; what the engines a spec allows cannot serve is a 422 saying why, with
nothing written; GET shows the engine asked for, the one chosen and why."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.domain.vllm_support import VLLM_VERSION
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import h, on_s3
from tests.integration.test_deploy_validation import LLAMA, upload, valid_model

STORE = "store-engine"
MIXTRAL = {**LLAMA, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}
GEMMA2 = {**LLAMA, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}
FP8 = {**LLAMA, "quantization_config": {"quant_method": "fp8"}}
GPTQ = {**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 4}}


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    # a platform with a vLLM environment (the API only needs to know it has one)
    return on_s3(
        settings,
        s3_env,
        store_bucket=STORE,
        validate_models=True,
        vllm_python="/opt/vllm/bin/python",
    )


@pytest.fixture
def key(tenants: dict[str, dict[str, str]]) -> str:
    return tenants["a"]["key"]


def checkpoint(client: TestClient, key: str, name: str, config: dict[str, Any]) -> str:
    files = {**valid_model(), "config.json": json.dumps(config).encode()}
    return upload(client, key, f"models/{name}", files)


def deploy(client: TestClient, key: str, model: str, **spec: Any) -> httpx.Response:
    body = {"name": "m", "model": model, **spec}
    return client.post("/v1/deployments", json=body, headers=h(key))


def shown(client: TestClient, key: str, name: str = "m") -> dict[str, Any]:
    r = client.get(f"/v1/deployments/{name}", headers=h(key))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def nothing_created(client: TestClient, key: str) -> None:
    r = client.get("/v1/deployments", headers=h(key))
    assert r.status_code == 200 and r.json()["data"] == [], r.text


def test_auto_takes_the_builtin_engine_for_what_it_serves(client: TestClient, key: str) -> None:
    uri = checkpoint(client, key, "llama", LLAMA)
    r = deploy(client, key, uri)
    assert r.status_code == 201, r.text
    body = shown(client, key)
    assert (body["engine"], body["engine_resolved"]) == ("auto", "builtin")
    assert "the built-in engine serves it (model_type 'llama'" in body["engine_reason"]
    assert {k: r.json()[k] for k in ("engine", "engine_resolved", "engine_reason")} == {
        k: body[k] for k in ("engine", "engine_resolved", "engine_reason")
    }


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (MIXTRAL, "model_type: 'mixtral' is not supported"),
        (GEMMA2, "model_type: 'gemma2' is not supported"),
        (FP8, "quantized weights (fp8)"),
        (GPTQ, "quantized weights (gptq)"),
    ],
)
def test_auto_takes_vllm_for_what_the_builtin_engine_cannot_serve(
    client: TestClient, key: str, config: dict[str, Any], why: str
) -> None:
    uri = checkpoint(client, key, "other", config)
    r = deploy(client, key, uri)
    assert r.status_code == 201, r.text
    body = shown(client, key)
    assert (body["engine"], body["engine_resolved"]) == ("auto", "vllm")
    assert f"auto: vLLM {VLLM_VERSION} serves it" in body["engine_reason"]
    assert why in body["engine_reason"]


def test_several_accelerators_go_to_vllm(client: TestClient, key: str) -> None:
    uri = checkpoint(client, key, "llama", LLAMA)
    assert deploy(client, key, uri, accelerator_count=2).status_code == 201
    body = shown(client, key)
    assert (body["accelerator_count"], body["engine_resolved"]) == (2, "vllm")
    assert "accelerator_count 2" in body["engine_reason"]


@pytest.mark.parametrize(
    ("config", "spec", "field", "why"),
    [
        (MIXTRAL, {}, "model", "model_type: 'mixtral' is not supported"),
        (FP8, {}, "model", "quantized weights (fp8)"),
        (LLAMA, {"accelerator_count": 2}, "accelerator_count", "on one accelerator"),
    ],
)
def test_builtin_asked_for_what_it_cannot_serve_is_refused(
    client: TestClient,
    key: str,
    config: dict[str, Any],
    spec: dict[str, Any],
    field: str,
    why: str,
) -> None:
    uri = checkpoint(client, key, "x", config)
    r = deploy(client, key, uri, engine="builtin", **spec)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert f"model {uri}: engine builtin cannot serve it: " in r.json()["detail"]
    assert why in r.json()["detail"]
    nothing_created(client, key)


def test_vllm_on_a_platform_without_it_is_refused(
    settings: Settings, redis_client: Any, key: str
) -> None:
    without = settings.model_copy(update={"vllm_python": ""})
    with TestClient(create_app(without)) as c:
        uri = checkpoint(c, key, "llama", LLAMA)
        r = deploy(c, key, uri, engine="vllm")
        assert r.status_code == 422, r.text
        assert [e["field"] for e in r.json()["errors"]] == ["engine"]
        assert "engine vllm cannot serve it: this platform has no vLLM" in r.json()["detail"]
        nothing_created(c, key)
        # auto still deploys what the built-in engine serves
        assert deploy(c, key, uri).status_code == 201
        assert shown(c, key)["engine_resolved"] == "builtin"


def test_vllm_asked_for_an_architecture_it_does_not_list_is_refused(
    client: TestClient, key: str
) -> None:
    encoder = {**LLAMA, "model_type": "bert", "architectures": ["BertModel"]}
    uri = checkpoint(client, key, "bert", encoder)
    r = deploy(client, key, uri, engine="vllm")
    assert r.status_code == 422, r.text
    assert "architecture BertModel is not among vLLM" in r.json()["detail"]
    # auto: neither engine; both reasons
    r = deploy(client, key, uri)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["model", "model"]
    assert "builtin: config.json: model_type: 'bert'" in r.json()["detail"]
    nothing_created(client, key)


def test_an_update_chooses_again_only_when_model_engine_or_accelerators_change(
    client: TestClient, key: str
) -> None:
    llama, mixtral = (checkpoint(client, key, n, c) for n, c in (("l", LLAMA), ("x", MIXTRAL)))
    assert deploy(client, key, llama).status_code == 201

    def put(**spec: Any) -> httpx.Response:
        return client.put("/v1/deployments/m", json={"name": "m", **spec}, headers=h(key))

    assert put(model=llama, engine="vllm").status_code == 200
    assert (shown(client, key)["engine_resolved"], shown(client, key)["version"]) == ("vllm", 2)
    # refused: nothing changes
    r = put(model=mixtral, engine="builtin")
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "model", r.text
    r = put(model=llama, engine="builtin", accelerator_count=3)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "accelerator_count"
    after = shown(client, key)
    assert (after["version"], after["engine"], after["engine_resolved"]) == (2, "vllm", "vllm")
    # another field only: the engine and its reason stay
    assert put(model=llama, engine="vllm", max_workers=2).status_code == 200
    kept = shown(client, key)
    assert (kept["version"], kept["engine_resolved"]) == (3, "vllm")
    assert kept["engine_reason"] == after["engine_reason"]
    # a new model under auto: chosen again
    assert put(model=mixtral, max_workers=2).status_code == 200
    assert "mixtral" in shown(client, key)["engine_reason"]


def test_a_model_not_read_at_deploy_says_so(
    settings: Settings, redis_client: Any, key: str
) -> None:
    with TestClient(create_app(settings)) as c:
        r = deploy(c, key, "hf://org/some-model")
        assert r.status_code == 201, r.text
        body = shown(c, key)
        assert body["engine_resolved"] == "builtin"
        assert "assumed; hf:// models are not read at deploy" in body["engine_reason"]
        r = deploy(c, key, "hf://org/some-moe", name="moe", accelerator_count=4)
        assert r.status_code == 201, r.text
        assert shown(c, key, "moe")["engine_resolved"] == "vllm"
    unchecked = settings.model_copy(update={"validate_models": False})
    with TestClient(create_app(unchecked)) as c:
        assert deploy(c, key, "store://models/none/", name="n").status_code == 201
        assert "PLATFORM_VALIDATE_MODELS is off" in shown(c, key, "n")["engine_reason"]

"""Deploy-time model validation against the real API, SQL, Redis and S3 server (rclone): a
deployment whose model a worker would refuse is answered 422 naming the URI and the problem,
and nothing is written; missing and forbidden models answer alike; `?dry_run=true` checks
everything and writes nothing."""

from __future__ import annotations

import json
import struct
import uuid
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save as save_safetensors

from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import h, on_s3

STORE = "store-validation"
LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def weights(*names: str) -> bytes:
    """A small, valid safetensors file holding one tensor per name."""
    return save_safetensors({n: torch.arange(8, dtype=torch.float32) for n in names})


def valid_model() -> dict[str, bytes]:
    return {"config.json": json.dumps(LLAMA).encode(), "model.safetensors": weights("a", "b")}


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    # validate_models: what is under test (the integration settings turn it off)
    return on_s3(settings, s3_env, store_bucket=STORE, validate_models=True)


@pytest.fixture
def keys(tenants: dict[str, dict[str, str]]) -> dict[str, str]:
    """Admin keys of the operator's tenant `op` and of tenants `a` and `b`."""
    return {name: t["key"] for name, t in tenants.items()}


def upload(client: TestClient, key: str, prefix: str, files: dict[str, bytes]) -> str:
    """Put `files` under store://<prefix>/ of the key's tenant; the model URI."""
    for name, data in files.items():
        r = client.put(f"/v1/files/{prefix}/{name}", content=data, headers=h(key))
        assert r.status_code == 201, r.text
    return f"store://{prefix}/"


def deploy(
    client: TestClient, key: str, model: str, name: str = "m", **params: Any
) -> httpx.Response:
    spec = {"name": name, "model": model}
    return client.post("/v1/deployments", json=spec, params=params, headers=h(key))


def names(client: TestClient, key: str) -> list[str]:
    r = client.get("/v1/deployments", headers=h(key))
    assert r.status_code == 200, r.text
    return [d["name"] for d in r.json()["data"]]


def refused(r: httpx.Response, *parts: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["errors"][0]["field"] == "model"
    for part in parts:
        assert part in body["detail"], body["detail"]


def test_a_valid_model_deploys_and_a_dry_run_writes_nothing(
    client: TestClient, keys: dict[str, str]
) -> None:
    uri = upload(client, keys["a"], "models/ok", valid_model())
    dry = deploy(client, keys["a"], uri, dry_run="true")
    assert dry.status_code == 200, dry.text
    assert dry.json()["model"] == uri and dry.json()["version"] == 1
    assert names(client, keys["a"]) == []
    assert client.get("/v1/deployments/m", headers=h(keys["a"])).status_code == 404

    created = deploy(client, keys["a"], uri)
    assert created.status_code == 201, created.text
    assert names(client, keys["a"]) == ["m"]
    # A dry run of a taken name answers as the real call would.
    assert deploy(client, keys["a"], uri, dry_run="true").status_code == 409


def test_an_index_and_its_shards_are_checked(client: TestClient, keys: dict[str, str]) -> None:
    index = {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
    files = {
        "config.json": json.dumps(LLAMA).encode(),
        "model.safetensors.index.json": json.dumps(index).encode(),
        "model-1.safetensors": weights("a"),
    }
    uri = upload(client, keys["a"], "models/sharded", files)
    refused(
        deploy(client, keys["a"], uri),
        f"model {uri}: shard model-2.safetensors named in model.safetensors.index.json "
        "does not exist or is not readable",
    )
    upload(client, keys["a"], "models/sharded", {"model-2.safetensors": weights("c")})
    refused(deploy(client, keys["a"], uri), "tensors named in the index are in no shard")
    upload(client, keys["a"], "models/sharded", {"model-2.safetensors": weights("b")})
    assert deploy(client, keys["a"], uri).status_code == 201

    escape = {"weight_map": {"a": "../../other/model.safetensors"}}
    bad = upload(
        client,
        keys["a"],
        "models/escape",
        {**files, "model.safetensors.index.json": json.dumps(escape).encode()},
    )
    refused(deploy(client, keys["a"], bad, name="e"), "is not a file name")
    assert names(client, keys["a"]) == ["m"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "builtin: config.json: model_type: 'gpt2' is not supported"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "builtin: config.json: rope_scaling:",
        ),
        ({"hidden_act": "gelu"}, "builtin: config.json: hidden_act: 'gelu' is not supported"),
        # quantized checkpoints: refused before a worker fetches their weights
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
            "builtin: quantized weights (fp8)",
        ),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quantized weights (gptq)"),
    ],
)
def test_a_config_no_engine_of_the_platform_serves_is_refused(
    client: TestClient, keys: dict[str, str], change: dict[str, Any], message: str
) -> None:
    """What the built-in engine refuses, on a platform without vLLM (these settings): both
    reasons (test_deploy_engine.py: the same configs where vLLM is)."""
    files = {**valid_model(), "config.json": json.dumps({**LLAMA, **change}).encode()}
    uri = upload(client, keys["a"], "models/cfg", files)
    r = deploy(client, keys["a"], uri)
    refused(
        r,
        f"model {uri}: neither engine can serve it: ",
        message,
        "vllm: this platform has no vLLM environment",
    )
    assert names(client, keys["a"]) == []


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"config.json": b"[1, 2]"}, "config.json: not a JSON object"),
        ({"config.json": b"{nope"}, "config.json: not valid JSON"),
        ({"config.json": b"[" * 100_000 + b"]" * 100_000}, "config.json: not valid JSON"),
        (
            {"model.safetensors": struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000},
            "model.safetensors: header is not valid JSON",
        ),
        ({"model.safetensors": b"garbage!" * 4}, "model.safetensors: header length"),
        ({"model.safetensors": b"\x01"}, "too small for a safetensors header"),
        (
            {"model.safetensors": struct.pack("<Q", 1_000) + b"{}"},
            "model.safetensors: header length 1000 does not fit",
        ),
        (
            {"model.safetensors": struct.pack("<Q", 2) + b"[]"},
            "model.safetensors: header is not a JSON object",
        ),
        (
            # a valid header whose data section was cut short (a truncated upload)
            {"model.safetensors": weights("a")[:-4]},
            "outside the data section",
        ),
    ],
)
def test_corrupt_files_are_refused(
    client: TestClient, keys: dict[str, str], files: dict[str, bytes], message: str
) -> None:
    uri = upload(client, keys["a"], "models/corrupt", {**valid_model(), **files})
    refused(deploy(client, keys["a"], uri), message)
    assert names(client, keys["a"]) == []


def test_missing_weights_are_refused(client: TestClient, keys: dict[str, str]) -> None:
    uri = upload(client, keys["a"], "models/noweights", {"config.json": json.dumps(LLAMA).encode()})
    refused(
        deploy(client, keys["a"], uri),
        "neither model.safetensors.index.json nor model.safetensors nor any *.safetensors "
        "file exists or is readable",
    )


def test_a_directory_of_safetensors_files_without_an_index_deploys(
    client: TestClient, keys: dict[str, str]
) -> None:
    """The loader reads every *.safetensors of a directory with neither an index nor a
    model.safetensors; the deploy-time check accepts what it loads, and checks each header."""
    files = {
        "config.json": json.dumps(LLAMA).encode(),
        "part-a.safetensors": weights("model.embed_tokens.weight"),
        "part-b.safetensors": weights("lm_head.weight"),
    }
    uri = upload(client, keys["a"], "models/parts", files)
    r = deploy(client, keys["a"], uri)
    assert r.status_code == 201, r.text
    # one of them corrupt: refused, naming it
    bad = {**files, "part-b.safetensors": b"\x10\x00\x00\x00\x00\x00\x00\x00{not json"}
    uri = upload(client, keys["a"], "models/parts-bad", bad)
    refused(deploy(client, keys["a"], uri, name="parts-bad"), "part-b.safetensors")


def test_missing_and_forbidden_models_answer_alike(
    client: TestClient, keys: dict[str, str], s3_env: S3Server
) -> None:
    # A model in a tenant bucket; `a` holds the right credentials, `b` wrong ones.
    prefix = f"v-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3", endpoint_url=s3_env.url)  # credentials from s3_env
    for name, data in valid_model().items():
        s3.put_object(Bucket="models", Key=f"{prefix}/{name}", Body=data)
    for who, secret in (("a", s3_env.secret_key), ("b", "wrong-secret-0123456789")):
        body = {"bucket": "models", "access_key_id": s3_env.access_key, "secret_access_key": secret}
        r = client.post("/v1/storage-credentials", json=body, headers=h(keys[who]))
        assert r.status_code == 201, r.text
    uri = f"s3://models/{prefix}/"

    forbidden = deploy(client, keys["b"], uri)
    assert deploy(client, keys["a"], uri, dry_run="true").status_code == 200
    for name in valid_model():
        s3.delete_object(Bucket="models", Key=f"{prefix}/{name}")
    missing = deploy(client, keys["a"], uri)
    refused(missing, f"{uri}config.json does not exist or is not readable")
    assert forbidden.status_code == missing.status_code == 422
    assert forbidden.content == missing.content
    # In the tenant's own namespace as well: a path nobody uploaded.
    refused(deploy(client, keys["b"], "store://models/none/"), "does not exist or is not readable")
    assert names(client, keys["a"]) == names(client, keys["b"]) == []


def test_an_update_to_a_bad_model_keeps_the_old_version(
    client: TestClient, keys: dict[str, str]
) -> None:
    good = upload(client, keys["a"], "models/good", valid_model())
    bad = upload(
        client,
        keys["a"],
        "models/bad",
        {**valid_model(), "config.json": json.dumps({**LLAMA, "model_type": "gpt2"}).encode()},
    )
    assert deploy(client, keys["a"], good).status_code == 201
    spec = {"name": "m", "model": bad}
    refused(client.put("/v1/deployments/m", json=spec, headers=h(keys["a"])), "gpt2")
    after = client.get("/v1/deployments/m", headers=h(keys["a"])).json()
    assert (after["model"], after["version"]) == (good, 1)

    # A dry run of a good change answers the new version and leaves the old one.
    change = {"name": "m", "model": good, "max_workers": 3}
    dry = client.put(
        "/v1/deployments/m", json=change, params={"dry_run": "true"}, headers=h(keys["a"])
    )
    assert dry.status_code == 200, dry.text
    assert (dry.json()["version"], dry.json()["max_workers"]) == (2, 3)
    after = client.get("/v1/deployments/m", headers=h(keys["a"])).json()
    assert (after["version"], after["max_workers"]) != (2, 3)
    ok = client.put("/v1/deployments/m", json=change, headers=h(keys["a"]))
    assert ok.status_code == 200 and ok.json()["version"] == 2


def test_host_path_models_are_checked(
    settings: Settings, redis_client: Any, keys: dict[str, str], tmp_path: Path
) -> None:
    allowed = Settings(**{**settings.model_dump(), "allow_host_paths": True})
    for name, data in valid_model().items():
        (tmp_path / name).write_bytes(data)
    with TestClient(create_app(allowed)) as c:
        assert deploy(c, keys["op"], str(tmp_path)).status_code == 201
        (tmp_path / "model.safetensors").write_bytes(b"\x00" * 3)
        refused(deploy(c, keys["op"], str(tmp_path), name="m2"), "too small")


def test_validation_can_be_turned_off(
    settings: Settings, redis_client: Any, keys: dict[str, str]
) -> None:
    off = Settings(**{**settings.model_dump(), "validate_models": False})
    with TestClient(create_app(off)) as c:
        assert deploy(c, keys["a"], "store://models/none/").status_code == 201


def test_more_than_one_accelerator_without_vllm_is_refused_not_ignored(
    client: TestClient, keys: dict[str, str]
) -> None:
    """Several accelerators per worker are vLLM's tensor parallelism; a platform without vLLM
    refuses them, naming the field."""
    uri = upload(client, keys["a"], "models/tp", valid_model())
    spec = {"name": "tp", "model": uri, "accelerator_count": 2}
    r = client.post("/v1/deployments", json=spec, headers=h(keys["a"]))
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["accelerator_count", "engine"]
    assert "one accelerator" in r.json()["detail"]
    assert names(client, keys["a"]) == []
    assert (
        client.post(
            "/v1/deployments", json={**spec, "accelerator_count": 1}, headers=h(keys["a"])
        ).status_code
        == 201
    )

"""`platform models`: upload through the API's file store or straight to S3, and verify (exec the
loader)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from sdk.cli import model_files
from sdk.cli import models as models_cli
from tests.unit.cli.mock_api import Routes, invoke


def test_models_upload_into_the_namespace_goes_through_the_api(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "w b.safetensors").write_bytes(b"\1" * 10)

    def stored(path: str, size: int) -> httpx.Response:
        return httpx.Response(201, json={"path": path, "uri": f"store://{path}", "bytes": size})

    routes = Routes({
        "PUT /v1/files/models/demo/config.json": stored("models/demo/config.json", 2),
        "PUT /v1/files/models/demo/sub/w b.safetensors": stored("models/demo/sub/w b", 10),
    })  # fmt: skip
    result = invoke(["models", "upload", str(model), "store://models/demo"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "store://models/demo/"
    [weights] = [r for r in routes.requests if r.url.path.endswith(".safetensors")]
    assert weights.content == b"\1" * 10 and weights.url.raw_path.endswith(b"/w%20b.safetensors")
    # a refusal from the platform is the user's error, shown with its fields
    refused = Routes({"PUT /v1/files/models/x/config.json": httpx.Response(
        422, json={"title": "Invalid Request", "status": 422, "detail": "bad path",
                   "errors": [{"field": "path", "message": "bad"}]},
    )})  # fmt: skip
    result = invoke(["models", "upload", str(model), "models/x/"], refused)
    assert result.exit_code == 1 and "path: bad" in result.stderr


def test_models_upload_puts_every_file_under_the_prefix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    moto = pytest.importorskip("moto")
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "model.safetensors").write_bytes(b"\0" * 1000)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PLATFORM_S3_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        import boto3

        result = invoke(["models", "upload", str(model), "s3://models/demo"])
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == "s3://models/demo/"
        listed = boto3.client("s3").list_objects_v2(Bucket="models")["Contents"]
        assert sorted(o["Key"] for o in listed) == [
            "demo/config.json",
            "demo/sub/model.safetensors",
        ]
    assert invoke(["models", "upload", str(model), "gs://x/y"]).exit_code == 1


@pytest.mark.parametrize(("loader_code", "cli_code"), [(0, 0), (2, 1), (3, 1), (1, 2), (-9, 2)])
def test_models_verify_runs_the_loader_and_keeps_to_the_exit_codes(
    monkeypatch: pytest.MonkeyPatch, loader_code: int, cli_code: int
) -> None:
    calls: list[list[str]] = []

    def fake_call(args: list[str]) -> int:
        calls.append(args)
        return loader_code

    monkeypatch.setattr(models_cli, "_loader_main_exists", lambda: True)
    monkeypatch.setattr(model_files.subprocess, "call", fake_call)
    result = invoke(["models", "verify", "s3://models/demo/", "--device", "cpu"])
    assert result.exit_code == cli_code, result.output
    assert calls == [[sys.executable, "-m", "loader", "s3://models/demo/", "--device", "cpu"]]


def test_models_verify_checks_a_store_model_through_the_platform() -> None:
    listed = {"data": [{"path": "models/demo/config.json", "bytes": 612}], "has_more": False}
    routes = Routes({
        "GET /v1/files": httpx.Response(200, json=listed),
        "POST /v1/deployments": httpx.Response(200, json={"name": "verify-x"}),
    })  # fmt: skip
    result = invoke(["models", "verify", "store://models/demo/"], routes)
    assert result.exit_code == 0, result.output
    assert "models/demo/config.json  612 B" in result.stdout
    assert "ok: the platform can load store://models/demo/" in result.stdout
    create = next(r for r in routes.requests if r.method == "POST")
    assert create.url.params["dry_run"] == "true"
    assert routes.body("POST /v1/deployments")["model"] == "store://models/demo/"
    # a model the platform refuses: its 422, exit 1
    refused = Routes({
        "GET /v1/files": httpx.Response(200, json=listed),
        "POST /v1/deployments": httpx.Response(422, json={
            "title": "Invalid Request", "status": 422, "detail": "no weights",
            "errors": [{"field": "model", "message": "no weights"}]}),
    })  # fmt: skip
    result = invoke(["models", "verify", "store://models/demo/"], refused)
    assert result.exit_code == 1 and "model: no weights" in result.stderr
    empty = Routes({"GET /v1/files": httpx.Response(200, json={"data": [], "has_more": False})})
    result = invoke(["models", "verify", "store://models/none/"], empty)
    assert result.exit_code == 1 and "no files there" in result.stderr


def test_models_upload_warns_without_safetensors(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0")
    assert "no .safetensors file" in str(model_files.weights_warning([tmp_path / "x.bin"]))
    assert model_files.weights_warning([tmp_path / "model.safetensors"]) is None


def test_models_verify_without_the_loader_cli_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models_cli, "_loader_main_exists", lambda: False)
    result = invoke(["models", "verify", "s3://models/demo/"])
    assert result.exit_code == 1 and "python -m loader" in result.stderr

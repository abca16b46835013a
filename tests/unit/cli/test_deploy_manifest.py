"""`platform deploy` checks the manifest and its flags locally: bad YAML, unknown fields, wrong
types and bad model URIs are named with their line, exit 1, and nothing is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk.cli.manifest import check_model_uri
from tests.unit.cli.mock_api import Routes, invoke, not_found, write


def test_bad_yaml_is_refused_with_its_line(tmp_path: Path) -> None:
    manifest = write(tmp_path, "name: demo\nmodel: s3://m/d/\nmax_workers: [1\n")
    routes = Routes({})
    result = invoke(["deploy", str(manifest)], routes)
    assert result.exit_code == 1
    assert f"{manifest}:4" in result.stderr or f"{manifest}:3" in result.stderr
    assert "invalid YAML" in result.stderr
    assert routes.requests == []


def test_unknown_field_is_named_with_its_line(tmp_path: Path) -> None:
    manifest = write(tmp_path, "name: demo\nmodel: s3://m/d/\nmax_worker: 2\n")
    routes = Routes({})
    result = invoke(["deploy", str(manifest)], routes)
    assert result.exit_code == 1
    assert f"{manifest}:3: max_worker: unknown field (did you mean 'max_workers'?)" in (
        result.stderr
    )
    assert routes.requests == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_workers: two", "max_workers: must be an integer, got 'two'"),
        ("max_workers: true", "max_workers: must be an integer, got true"),
        ("scaledown_window_s: -5", "scaledown_window_s: must be >= 0 seconds"),
        ("cold_penalty_s: -1", "cold_penalty_s: must be >= 0 seconds"),
        ("queue_wait_s: -1", "queue_wait_s: must be >= 0 seconds"),
        ("queue_wait_s: soon", "queue_wait_s: must be a number, got 'soon'"),
        ("max_boot_s: 0", "max_boot_s: must be > 0 seconds"),
        ("defaults:\n  max_tokens: 1.5", "defaults.max_tokens: must be an integer"),
        ("defaults:\n  temprature: 1", "defaults.temprature: unknown field"),
    ],
)
def test_wrong_types_are_named_with_their_line(tmp_path: Path, line: str, message: str) -> None:
    manifest = write(tmp_path, f"name: demo\nmodel: s3://m/d/\n{line}\n")
    result = invoke(["deploy", str(manifest)], Routes({}))
    assert result.exit_code == 1
    assert message in result.stderr
    field_line = 4 if line.startswith("defaults") else 3
    assert f"{manifest}:{field_line}:" in result.stderr


@pytest.mark.parametrize(
    "uri", ["gs://bucket/model", "models/demo", "s3:///no-bucket", "hf://just-a-repo", "store://"]
)
def test_bad_model_uris_are_refused(tmp_path: Path, uri: str) -> None:
    manifest = write(tmp_path, f"name: demo\nmodel: {uri}\n")
    result = invoke(["deploy", str(manifest)], Routes({}))
    assert result.exit_code == 1
    assert f"{manifest}:2: model:" in result.stderr

    result = invoke(["deploy", "--name", "demo", "--model", uri], Routes({}))
    assert result.exit_code == 1
    assert "--model: model:" in result.stderr


def test_model_uri_rules() -> None:
    for good in (
        "store://m/d/",
        "s3://b/p/",
        "file:///models/x",
        "hf://org/repo@main",
        "/abs/path",
    ):
        assert check_model_uri(good) is None, good
    assert "unsupported" in str(check_model_uri("https://example.com/m"))


def test_a_repeated_key_and_a_non_mapping_are_refused(tmp_path: Path) -> None:
    manifest = write(tmp_path, "name: demo\nmodel: s3://m/d/\nname: other\n")
    result = invoke(["deploy", str(manifest)], Routes({}))
    assert result.exit_code == 1
    assert f"{manifest}:3: name: repeated (first on line 1)" in result.stderr

    manifest = write(tmp_path, "- name: demo\n")
    result = invoke(["deploy", str(manifest)], Routes({}))
    assert result.exit_code == 1
    assert "must be a mapping" in result.stderr


def test_a_new_deployment_needs_a_model_and_min_below_max() -> None:
    routes = Routes({"GET /v1/deployments/demo": not_found()})
    result = invoke(["deploy", "--name", "demo"], routes)
    assert result.exit_code == 1
    assert "model: missing" in result.stderr

    args = ["deploy", "--name", "demo", "--model", "s3://m/d/", "--min-workers", "3"]
    result = invoke([*args, "--max-workers", "2"], routes)
    assert result.exit_code == 1
    assert "min_workers: 3 is more than max_workers (2)" in result.stderr
    assert "POST /v1/deployments" not in routes.called()


def test_a_negative_queue_wait_flag_is_refused_before_anything_is_sent() -> None:
    routes = Routes({})
    result = invoke(["deploy", "--name", "demo", "--queue-wait", "-1"], routes)
    assert result.exit_code == 1
    assert "--queue-wait: queue_wait_s: must be >= 0 seconds, got -1.0" in result.stderr
    assert routes.requests == []

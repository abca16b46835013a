"""The `platform` CLI through typer's CliRunner, against httpx.MockTransport (no server)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from sdk.cli import local
from sdk.cli._common import CliState
from sdk.cli.main import app
from sdk.cli.manifest import check_model_uri, diff_specs
from sdk.cli.run import parse_inputs

DEPLOYMENT = {
    "id": "dep_1",
    "name": "demo",
    "model": "s3://models/demo/",
    "accelerator": "cpu",
    "min_workers": 0,
    "max_workers": 1,
    "scaledown_window_s": 60,
    "max_boot_s": 600,
    "execution_timeout_s": 600,
    "defaults": {"max_tokens": 64},
    "version": 3,
    "workers": {"idle": 1, "busy": 2},
}


class Routes:
    """A MockTransport handler: "METHOD /path" -> answers (the last one repeats)."""

    def __init__(self, routes: dict[str, httpx.Response | list[httpx.Response]]) -> None:
        self.routes = {k: v if isinstance(v, list) else [v] for k, v in routes.items()}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        key = f"{request.method} {request.url.path}"
        answers = self.routes.get(key)
        if not answers:
            return httpx.Response(404, json={"title": "Not Found", "detail": f"no route {key}"})
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def called(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]

    def body(self, key: str) -> Any:
        [request] = [r for r in self.requests if f"{r.method} {r.url.path}" == key]
        return json.loads(request.content)


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PLATFORM_URL", "PLATFORM_API_KEY", "PLATFORM_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PLATFORM_CONFIG", str(tmp_path / "config.json"))


def invoke(args: list[str], routes: Routes | None = None, **client_options: Any) -> Any:
    options: dict[str, Any] = {"sleep": lambda _s: None, **client_options}
    if routes is not None:
        options["transport"] = httpx.MockTransport(routes)
    state = CliState(url="http://platform.test", client_options=options)
    return CliRunner().invoke(app, args, obj=state)


def not_found(detail: str = "deployment 'demo' does not exist") -> httpx.Response:
    return httpx.Response(404, json={"title": "Not Found", "status": 404, "detail": detail})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


# --- deploy: local validation (exit 1, nothing sent) ----------------------------------------


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


# --- deploy: dry run, create, update --------------------------------------------------------


def test_dry_run_shows_the_changes_and_changes_nothing(tmp_path: Path) -> None:
    manifest = write(tmp_path, "name: demo\nmodel: s3://models/demo/\nmax_workers: 4\n")
    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
            "PUT /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
        }
    )
    result = invoke(["deploy", str(manifest), "--max-tokens", "32", "--dry-run"], routes)
    assert result.exit_code == 0, result.output
    assert "update deployment 'demo' (version 3)" in result.stdout
    assert "~ max_workers: 1 -> 4" in result.stdout
    assert "~ defaults.max_tokens: 64 -> 32" in result.stdout
    assert "dry run: the platform accepts it; nothing changed" in result.stdout
    # the platform checked the new spec, as a dry run
    assert routes.called() == ["GET /v1/deployments/demo", "PUT /v1/deployments/demo"]
    (put,) = [r for r in routes.requests if r.method == "PUT"]
    assert put.url.params["dry_run"] == "true"
    assert routes.body("PUT /v1/deployments/demo")["max_workers"] == 4


def test_dry_run_of_a_new_deployment() -> None:
    routes = Routes(
        {
            "GET /v1/deployments/demo": not_found(),
            "POST /v1/deployments": httpx.Response(200, json={**DEPLOYMENT, "version": 1}),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--model", "s3://m/d/", "--dry-run"], routes)
    assert result.exit_code == 0, result.output
    assert "create deployment 'demo'" in result.stdout
    assert "+ model: 's3://m/d/'" in result.stdout
    assert routes.called() == ["GET /v1/deployments/demo", "POST /v1/deployments"]
    assert routes.requests[-1].url.params["dry_run"] == "true"


def test_a_dry_run_the_platform_refuses_says_why_and_fails() -> None:
    problem = {
        "title": "Unprocessable Entity",
        "status": 422,
        "detail": "model 's3://m/d/': config.json: not found",
    }
    routes = Routes(
        {
            "GET /v1/deployments/demo": not_found(),
            "POST /v1/deployments": httpx.Response(
                422, json=problem, headers={"content-type": "application/problem+json"}
            ),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--model", "s3://m/d/", "--dry-run"], routes)
    assert result.exit_code != 0
    assert "config.json: not found" in result.stderr
    assert "dry run: the platform accepts it" not in result.stdout


def test_deploy_creates_when_missing_and_updates_when_present(tmp_path: Path) -> None:
    manifest = write(tmp_path, "name: demo\nmodel: s3://m/d/\naccelerator: cpu\n")
    created = {**DEPLOYMENT, "version": 1}
    routes = Routes(
        {
            "GET /v1/deployments/demo": not_found(),
            "POST /v1/deployments": httpx.Response(201, json=created),
        }
    )
    result = invoke(["deploy", str(manifest), "--max-workers", "2"], routes)
    assert result.exit_code == 0, result.output
    assert routes.body("POST /v1/deployments") == {
        "name": "demo",
        "model": "s3://m/d/",
        "accelerator": "cpu",
        "max_workers": 2,
    }
    assert "created deployment 'demo' (version 1)" in result.stdout

    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
            "PUT /v1/deployments/demo": httpx.Response(200, json={**DEPLOYMENT, "version": 4}),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--max-workers", "2"], routes)
    assert result.exit_code == 0, result.output
    sent = routes.body("PUT /v1/deployments/demo")
    assert sent["max_workers"] == 2 and sent["model"] == DEPLOYMENT["model"]  # the rest is kept
    assert "version" not in sent and "workers" not in sent
    assert "updated deployment 'demo' (version 4)" in result.stdout


def test_deploy_without_changes_sends_nothing() -> None:
    routes = Routes({"GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT)})
    result = invoke(["deploy", "--name", "demo", "--max-workers", "1"], routes)
    assert result.exit_code == 0
    assert "is up to date (version 3)" in result.stdout
    assert routes.called() == ["GET /v1/deployments/demo"]


def test_queue_wait_is_set_by_flag_or_manifest_and_zero_is_accepted(tmp_path: Path) -> None:
    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=DEPLOYMENT),
            "PUT /v1/deployments/demo": httpx.Response(200, json={**DEPLOYMENT, "version": 4}),
        }
    )
    result = invoke(["deploy", "--name", "demo", "--queue-wait", "0"], routes)
    assert result.exit_code == 0, result.output
    assert "+ queue_wait_s: 0.0" in result.stdout
    assert routes.body("PUT /v1/deployments/demo")["queue_wait_s"] == 0

    current = {**DEPLOYMENT, "queue_wait_s": 2.0}
    routes = Routes(
        {
            "GET /v1/deployments/demo": httpx.Response(200, json=current),
            "PUT /v1/deployments/demo": httpx.Response(200, json={**current, "version": 4}),
        }
    )
    manifest = write(tmp_path, "name: demo\nqueue_wait_s: 5\n")
    result = invoke(["deploy", str(manifest)], routes)
    assert result.exit_code == 0, result.output
    assert "~ queue_wait_s: 2.0 -> 5" in result.stdout
    assert routes.body("PUT /v1/deployments/demo")["queue_wait_s"] == 5


def test_a_negative_queue_wait_flag_is_refused_before_anything_is_sent() -> None:
    routes = Routes({})
    result = invoke(["deploy", "--name", "demo", "--queue-wait", "-1"], routes)
    assert result.exit_code == 1
    assert "--queue-wait: queue_wait_s: must be >= 0 seconds, got -1.0" in result.stderr
    assert routes.requests == []


def test_diff_lines() -> None:
    assert diff_specs({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": "x"}) == ["~ b: 2 -> 3", "+ c: 'x'"]
    old = {"defaults": {"max_tokens": 64, "seed": 1}}
    new = {"defaults": {"max_tokens": 64, "top_p": 0.9}}
    assert diff_specs(old, new) == ["- defaults.seed: 1", "+ defaults.top_p: 0.9"]


# --- run ------------------------------------------------------------------------------------


def test_parse_inputs_reads_json_values_and_keeps_prompts_as_text() -> None:
    parsed = parse_inputs(
        ["prompt=42", "max_tokens=16", "temperature=0.5", 'stop=["\\n"]', "seed=null", "x=a=b"]
    )
    assert parsed == {
        "prompt": "42",
        "max_tokens": 16,
        "temperature": 0.5,
        "stop": ["\n"],
        "seed": None,
        "x": "a=b",
    }
    assert parse_inputs(["note=not json {"]) == {"note": "not json {"}
    for bad in (["prompt"], ["=x"], ["a=1", "a=2"]):
        with pytest.raises(ValueError):
            parse_inputs(bad)


def test_run_sends_the_parsed_input_and_prints_the_text() -> None:
    job = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=job)})
    result = invoke(["run", "demo", "--input", "prompt=Hi there", "-i", "max_tokens=8"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello!\n"
    body = routes.body("POST /v1/deployments/demo/run")
    assert body["input"] == {"prompt": "Hi there", "max_tokens": 8}
    assert body["stream"] is False


def test_run_json_prints_the_job() -> None:
    job = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=job)})
    result = invoke(["run", "demo", "-i", "prompt=Hi", "--json"], routes)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == job


def test_run_stream_prints_deltas() -> None:
    final = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    events = (
        'event: output\ndata: {"delta": "Hel"}\n\n'
        'event: output\ndata: {"delta": "lo!"}\n\n'
        f"event: completed\ndata: {json.dumps(final)}\n\n"
    )
    answer = httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})
    routes = Routes({"POST /v1/deployments/demo/run": answer})
    result = invoke(["run", "demo", "-i", "prompt=Hi", "--stream"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello!\n"
    assert routes.body("POST /v1/deployments/demo/run")["stream"] is True


def test_run_input_mistakes_exit_1() -> None:
    assert invoke(["run", "demo"], Routes({})).exit_code == 1
    result = invoke(["run", "demo", "--input", "prompt"], Routes({}))
    assert result.exit_code == 1
    assert "expected key=value" in result.stderr
    assert invoke(["run", "demo", "-i", "prompt=x", "--stream", "--json"]).exit_code == 1


def test_a_model_error_exits_1_and_a_platform_failure_exits_2() -> None:
    failed = {"id": "job_1", "status": "failed", "error": {"type": "model_error", "message": "x"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=failed)})
    result = invoke(["run", "demo", "-i", "prompt=Hi"], routes)
    assert result.exit_code == 1
    assert "job: job_1" in result.stderr

    lost = {**failed, "error": {"type": "worker_lost", "message": "no heartbeat"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=lost)})
    assert invoke(["run", "demo", "-i", "prompt=Hi"], routes).exit_code == 2


# --- exit codes -----------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: connecting is refused


def test_connection_refused_exits_2() -> None:
    # no outage budget: it is timed on the real clock, which the no-op sleep does not move
    options = {"sleep": lambda _s: None, "max_unavailable_s": 0}
    state = CliState(url=f"http://127.0.0.1:{closed_port()}", client_options=options)
    result = CliRunner().invoke(app, ["deployments", "list"], obj=state)
    assert result.exit_code == 2
    assert "cannot reach the platform" in result.stderr


def test_4xx_exits_1_and_5xx_exits_2() -> None:
    routes = Routes({"GET /v1/deployments/nope": not_found("deployment 'nope' does not exist")})
    result = invoke(["deployments", "get", "nope"], routes)
    assert result.exit_code == 1
    assert "404 Not Found: deployment 'nope' does not exist" in result.stderr

    broken = httpx.Response(500, json={"title": "Internal Server Error", "status": 500})
    result = invoke(["deployments", "list"], Routes({"GET /v1/deployments": broken}))
    assert result.exit_code == 2


def test_a_bad_url_exits_1() -> None:
    result = CliRunner().invoke(app, ["--url", "localhost:8000", "status"])
    assert result.exit_code == 1
    assert "invalid platform URL" in result.stderr


def test_usage_errors_exit_1() -> None:
    result = invoke(["deployments", "list", "--no-such-flag"])
    assert result.exit_code == 1
    assert "No such option" in result.output


# --- read commands --------------------------------------------------------------------------


def test_deployments_list_plain_and_json() -> None:
    routes = Routes({"GET /v1/deployments": httpx.Response(200, json={"data": [DEPLOYMENT]})})
    result = invoke(["deployments", "list"], routes)
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()
    assert header.split("\t")[0] == "name"
    assert row.split("\t") == ["demo", "3", "s3://models/demo/", "cpu", "0", "1", "busy=2 idle=1"]

    result = invoke(["deployments", "list", "--json"], routes)
    assert json.loads(result.stdout) == [DEPLOYMENT]


def test_jobs_get_shows_metadata_but_not_the_text() -> None:
    job = {
        "id": "job_1",
        "deployment": "demo",
        "status": "succeeded",
        "input": {"prompt": "my secret prompt"},
        "output": {"text": "my secret answer", "finish_reason": "stop"},
        "usage": {"prompt_tokens": 3, "generated_tokens": 4},
    }
    routes = Routes({"GET /v1/jobs/job_1": httpx.Response(200, json=job)})
    result = invoke(["jobs", "get", "job_1"], routes)
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.stdout and "16 chars (stop)" in result.stdout
    assert "secret" not in result.stdout
    assert json.loads(invoke(["jobs", "get", "job_1", "--json"], routes).stdout) == job


def test_billing_records_total_is_exact() -> None:
    records = [
        {"worker_id": "wrk_1", "phase": "busy", "seconds": "1.000", "amount": "0.100000"},
        {"worker_id": "wrk_1", "phase": "idle", "seconds": "2.000", "amount": "0.200000"},
    ]
    routes = Routes({"GET /v1/billing/records": httpx.Response(200, json={"data": records})})
    result = invoke(["billing", "records", "--deployment", "demo"], routes)
    assert result.exit_code == 0, result.output
    assert "total: 0.300000 over 2 records" in result.stdout
    assert routes.requests[0].url.params["deployment"] == "demo"


# --- login, up/down, models -----------------------------------------------------------------


def test_login_writes_a_private_config_file(tmp_path: Path) -> None:
    result = invoke(["login", "--url", "http://example.test:8000/", "--api-key", "sk_live_1"])
    assert result.exit_code == 0, result.output
    config = tmp_path / "config.json"
    assert json.loads(config.read_text()) == {
        "url": "http://example.test:8000",
        "api_key": "sk_live_1",
    }
    assert config.stat().st_mode & 0o777 == 0o600
    assert "sk_live_1" not in result.output
    assert invoke(["login", "--url", "example.test", "--api-key", "k"]).exit_code == 1


def test_up_execs_the_embedded_platform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(local.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append([path, *argv]))
    result = invoke(["up", "--port", "9000", "--state-dir", str(tmp_path), "--detach"])
    assert result.exit_code == 0, result.output
    embedded = [sys.executable, "-m", "control_plane.embedded"]
    up_args = ["up", "--port", "9000", "--state-dir", str(tmp_path), "--detach"]
    assert calls == [[sys.executable, *embedded, *up_args]]

    monkeypatch.setenv("PLATFORM_STATE_DIR", str(tmp_path / "state"))
    invoke(["down"])
    assert calls[-1][-3:] == ["down", "--state-dir", str(tmp_path / "state")]


def test_up_without_the_server_extra_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("must not exec"))
    result = invoke(["up"])
    assert result.exit_code == 1
    assert "pip install 'platform-serverless[server,worker]'" in result.stderr


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


def test_run_stream_shows_the_cold_start_then_prints_the_text() -> None:
    final = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    starting = [
        {"reason": "no_capacity", "phase": "booting", "eta_s": 9.0},
        {"reason": "loading_weights", "phase": "loading_weights", "eta_s": 4.0}
        | {"bytes_done": 300_000_000, "bytes_total": 1_200_000_000},
        {"reason": "loading_weights", "phase": "loading_weights", "eta_s": 2.0}
        | {"bytes_done": 900_000_000, "bytes_total": 1_200_000_000},
        {"reason": "warming", "phase": "warming", "eta_s": None},
    ]
    events = "".join(f"event: starting\ndata: {json.dumps(s)}\n\n" for s in starting) + (
        'event: running\ndata: {"attempt": 1}\n\n'
        'event: output\ndata: {"delta": "Hello!"}\n\n'
        f"event: completed\ndata: {json.dumps(final)}\n\n"
    )
    answer = httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})
    result = invoke(
        ["run", "demo", "-i", "prompt=Hi", "--stream"],
        Routes({"POST /v1/deployments/demo/run": answer}),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello!\n"
    # not a terminal: one line per phase on stderr (a log gets each step once)
    assert result.stderr.splitlines() == [
        "Cold start: booting a worker",
        "Cold start: loading weights (1.20 GB)",
        "Cold start: warming up",
    ]


def test_the_cold_start_bar_says_what_is_left() -> None:
    from sdk import RunStatus
    from sdk.cli.run import describe

    loading = RunStatus(
        "starting", "loading_weights", "loading_weights", 2.4, 6 * 10**8, 12 * 10**8
    )
    assert describe(loading)[0] == "Cold start: loading weights 0.60/1.20 GB, ready in ~2 s"
    booting = RunStatus("starting", "no_capacity", "booting", 0.2)
    assert describe(booting)[0] == "Cold start: booting a worker, ready in ~1 s"
    assert describe(RunStatus("starting", "warming", "warming"))[0] == "Cold start: warming up"
    assigned = RunStatus("starting", "assigning_warm_worker", "assigning_warm_worker", 0.8)
    assert describe(assigned)[0] == "Cold start: taking a warm worker, ready in ~1 s"

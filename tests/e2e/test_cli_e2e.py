"""The `platform` CLI as a subprocess against the live embedded platform: deploy --dry-run and
--wait, run --stream and --detach, jobs watch/list, status, keys, usage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdk import Client
from tests.e2e.conftest import cli
from tests.e2e.test_sdk_e2e import ensure_demo

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(
    platform: dict[str, Any], demo_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    ensure_demo(Client(base_url=platform["url"], api_key=platform["api_key"]), demo_model)
    config = tmp_path_factory.mktemp("cli") / "absent.json"
    return {**platform["env"], "PLATFORM_CONFIG": str(config)}


def ok(*args: str, env: dict[str, str]) -> str:
    done = cli(*args, env=env)
    assert done.returncode == 0, f"platform {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def test_deploy_dry_run_shows_changes_and_wait_follows_the_worker(
    env: dict[str, str], demo_model: Path
) -> None:
    out = ok("deploy", "--name", "demo", "--max-workers", "2", "--dry-run", env=env)
    assert "update deployment 'demo' (version 1):" in out
    assert "~ max_workers: 1 -> 2" in out and "dry run: the platform accepts it" in out
    # the dry run has the platform check the model: a missing one is refused, nothing created
    done = cli(
        "deploy", "--name", "dry-bad", "--model", "store://models/none/", "--dry-run", env=env
    )
    assert done.returncode != 0 and "store://models/none/" in done.stderr, done.stderr
    assert "dry-bad" not in ok("deployments", "list", env=env)

    done = cli("deploy", "--name", "demo", "--wait", env=env)
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout and "ready: worker wrk_" in done.stdout

    # A model that exists: deployments are validated (PLATFORM_VALIDATE_MODELS).
    done = cli("deploy", "--name", "lazy-cli", "--model", str(demo_model), "--wait", env=env)
    assert done.returncode == 0 and "min_workers 0" in done.stderr
    ok("deployments", "delete", "lazy-cli", env=env)


def test_run_stream_detach_and_watch(env: dict[str, str]) -> None:
    streamed = ok("run", "demo", "-i", "prompt=hi", "-i", "max_tokens=8", "--stream", env=env)
    plain = ok("run", "demo", "-i", "prompt=hi", "-i", "max_tokens=8", env=env)
    assert streamed.strip() and streamed == plain

    job_id = ok("run", "demo", "-i", "prompt=hi", "-i", "max_tokens=8", "--detach", env=env).strip()
    assert job_id.startswith("job_")
    watched = ok("jobs", "watch", job_id, env=env)
    assert watched.splitlines()[-1].split("s  ", 1)[1].startswith("succeeded")

    jobs = json.loads(ok("jobs", "list", "--json", "--limit", "5", env=env))
    assert isinstance(jobs, list) and job_id in [j["id"] for j in jobs]


def test_status_keys_and_usage(env: dict[str, str]) -> None:
    status = ok("status", env=env)
    assert "deployment(s)" in status and "demo" in status
    data = json.loads(ok("status", "--json", env=env))
    assert "demo" in [d["name"] for d in data["deployments"]]

    created = json.loads(ok("keys", "create", "--name", "e2e-cli", "--json", env=env))
    assert created["key"].startswith("pk_") and sorted(created["scopes"]) == ["read", "run"]
    assert created["id"] in ok("keys", "list", env=env)
    ok("keys", "revoke", created["key"], env=env)
    denied = cli("jobs", "list", env={**env, "PLATFORM_API_KEY": created["key"]})
    assert denied.returncode == 1 and "401" in denied.stderr

    usage = ok("usage", env=env)
    assert "cost by phase" in usage and "total:" in usage
    by_phase = json.loads(ok("usage", "--by", "phase", "--json", env=env))
    assert by_phase["group_by"] == "phase" and by_phase["data"]

    checked = cli("billing", "check", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("ok")
    assert json.loads(ok("billing", "check", "--json", env=env))["ok"] is True


def test_models_verify_loads_the_demo_weights(env: dict[str, str], demo_model: Path) -> None:
    from sdk.cli.models import _loader_main_exists

    if not _loader_main_exists():
        pytest.skip("the loader has no command line (python -m loader) in this tree yet")
    done = cli("models", "verify", str(demo_model), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tensors" in done.stdout + done.stderr


def test_verify_takes_the_store_uri_that_upload_printed(
    env: dict[str, str], demo_model: Path
) -> None:
    uploaded = ok("models", "upload", str(demo_model), "models/cli-verify/", env=env)
    uri = uploaded.strip().splitlines()[-1]
    assert uri == "store://models/cli-verify/"
    checked = ok("models", "verify", uri, env=env)
    assert "model.safetensors" in checked and "ok" in checked
    missing = cli("models", "verify", "store://models/nothing-here/", env=env)
    assert missing.returncode == 1 and "no files there" in missing.stderr


def test_up_on_a_running_platform_says_where_it_is(platform: dict[str, Any]) -> None:
    again = cli("up", "--detach", "--state-dir", str(platform["state_dir"]), env=platform["env"])
    assert again.returncode == 0, again.stdout + again.stderr
    said = again.stdout + again.stderr
    assert platform["url"] in said and "platform.json" in said
    assert platform["api_key"] not in said  # where the key is, never the key


def test_an_empty_id_is_one_line_not_a_traceback(env: dict[str, str]) -> None:
    done = cli("jobs", "get", "", env=env)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1

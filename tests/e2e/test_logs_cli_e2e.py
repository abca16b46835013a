"""`platform logs` as a subprocess against the live embedded platform: a job's, a worker's
and a deployment's lines from the real processes' logs, a follow that prints a new job's
lines as they are written, another tenant's job answered as a missing one, and never the
prompt (a secret in it) in anything printed."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from sdk import Client
from tests.e2e.conftest import BIN, cli
from tests.e2e.test_sdk_e2e import ensure_demo
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

SECRET = "wombat-persimmon-8812"  # in every prompt below; in no line printed


@pytest.fixture(scope="module")
def env(
    platform: dict[str, Any], demo_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    ensure_demo(Client(base_url=platform["url"], api_key=platform["api_key"]), demo_model)
    config = tmp_path_factory.mktemp("cli-logs") / "absent.json"
    return {**platform["env"], "PLATFORM_CONFIG": str(config)}


def _run_job(env: dict[str, str]) -> str:
    with Client(base_url=env["PLATFORM_URL"], api_key=env["PLATFORM_API_KEY"]) as client:
        job = client.run("demo", {"prompt": f"Tell {SECRET} a story", "max_tokens": 4}, wait=False)
        job.wait(timeout=120)
        return job.id


def _ok(*args: str, env: dict[str, str]) -> str:
    done = cli(*args, env=env)
    assert done.returncode == 0, f"platform {' '.join(args)}: {done.stdout}{done.stderr}"
    assert SECRET not in done.stdout + done.stderr
    return done.stdout


def test_a_jobs_worker_and_deployment_lines_without_the_prompt(env: dict[str, str]) -> None:
    job_id = _run_job(env)
    lines = [json.loads(x) for x in _ok("logs", job_id, "--json", env=env).splitlines()]
    assert lines and all(x["job_id"] == job_id for x in lines)
    components = {x["component"] for x in lines}
    assert {"api", "worker"} <= components, components  # the platform's and its worker's
    worker_id = next(x["worker_id"] for x in lines if x.get("worker_id"))

    text = _ok("logs", worker_id, "--limit", "5", env=env)
    assert 0 < len(text.splitlines()) <= 5 + text.count("Traceback")
    by_worker = [json.loads(x) for x in _ok("logs", worker_id, "--json", env=env).splitlines()]
    assert any(x.get("job_id") == job_id for x in by_worker)

    recent = _ok("logs", "demo", "--since", "10m", env=env)
    assert job_id in recent and "worker:" in recent


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_lines(seen: list[str], job_id: str, what: str) -> None:
    wait_for(lambda: any(job_id in line for line in seen), timeout_s=90, what=what)


def test_follow_prints_new_lines_as_they_come_until_interrupted(env: dict[str, str]) -> None:
    # The first job's lines may come before the follow's first read (a loaded machine starts
    # the CLI slowly), so they are in its window; the second job runs once the follow has
    # printed them, so its lines can only come as they are written.
    follow = subprocess.Popen(
        [str(BIN / "platform"), "logs", "demo", "--follow", "--since", "5m", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as a terminal's Ctrl-C sends it: a suite started in the background (`cmd &`)
        # runs with SIGINT ignored, which its children would inherit
        preexec_fn=_default_sigint,
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follow.stdout or []), daemon=True)
    reader.start()
    try:
        for what in ("the first job's lines", "the next job's lines"):
            _wait_for_lines(seen, _run_job(env), what)
    finally:
        follow.send_signal(signal.SIGINT)
        try:
            code = follow.wait(timeout=60)  # a loaded machine: the interpreter's own exit
        except subprocess.TimeoutExpired:
            follow.kill()
            follow.wait()
            raise AssertionError("platform logs --follow did not stop on SIGINT") from None
    reader.join(timeout=10)
    assert code == 0, follow.stderr.read() if follow.stderr else ""
    assert SECRET not in "".join(seen)
    assert all(json.loads(line) for line in seen if line.strip())


def test_an_unknown_job_is_a_clear_error(env: dict[str, str]) -> None:
    done = cli("logs", "job_0000000000000000000000", env=env)
    assert done.returncode == 1
    assert "job 'job_0000000000000000000000' does not exist" in done.stderr
    done = cli("logs", "demo", "--since", "yesterday", env=env)
    assert done.returncode == 1 and "since" in done.stderr

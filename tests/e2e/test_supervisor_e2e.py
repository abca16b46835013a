"""The embedded supervisor heals itself: a child killed with SIGKILL is started again (same
port, new pid in platform.json) and the platform keeps answering."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.embedded.processes import free_port
from tests.e2e.conftest import alive, cli, processes_mentioning


def state_of(state_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state_dir / "platform.json").read_text())
    return data


def wait_restarted(state_dir: Path, name: str, old_pid: int, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = int(state_of(state_dir)["children"].get(name, old_pid))
        if pid != old_pid and alive(pid):
            return pid
        time.sleep(0.1)
    log = (state_dir / "logs" / "platform.log").read_text(errors="replace")[-2000:]
    raise AssertionError(f"{name} was not restarted in {timeout_s}s:\n{log}")


@pytest.fixture
def own_platform(tmp_path: Path) -> Any:
    state_dir = tmp_path / "platform"
    env = {**os.environ, "PLATFORM_STATE_DIR": str(state_dir)}
    up = cli("up", "--detach", "--port", str(free_port()), "--state-dir", str(state_dir), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    yield state_dir, env
    down = cli("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    time.sleep(0.5)
    assert processes_mentioning(str(state_dir)) == []


def test_killed_children_come_back_and_the_api_answers(own_platform: Any) -> None:
    state_dir, _env = own_platform
    state = state_of(state_dir)
    headers = {"Authorization": f"Bearer {state['api_key']}"}
    for name in ("reconciler", "api", "redis"):
        old = int(state_of(state_dir)["children"][name])
        os.kill(old, signal.SIGKILL)
        new = wait_restarted(state_dir, name, old)
        assert new != old
    # the restarted API serves on the same port, with Redis and the database behind it
    deadline = time.monotonic() + 30
    while True:
        try:
            r = httpx.get(state["url"] + "/v1/deployments", headers=headers, timeout=2)
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "API did not come back"
        time.sleep(0.2)
    log = (state_dir / "logs" / "platform.log").read_text(errors="replace")
    assert "reconciler exited with -9; restarting it in" in log
    assert "api restarted (pid" in log

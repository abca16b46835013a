"""The embedded supervisor heals itself: a child killed with SIGKILL is started again (same
port, new pid in platform.json) and the platform keeps answering."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.embedded.lifecycle import DUMP_SIGNAL, down
from control_plane.embedded.processes import free_port
from control_plane.embedded.state import platform_log_path
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
    log = platform_log(state_dir)[-2000:]
    raise AssertionError(f"{name} was not restarted in {timeout_s}s:\n{log}")


@pytest.fixture
def own_platform(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    state_dir = tmp_path / "platform"
    env = {**os.environ, "PLATFORM_STATE_DIR": str(state_dir)}
    extra = getattr(request, "param", ())  # more `platform up` options
    up = cli(
        "up", "--detach", "--port", str(free_port()), "--state-dir", str(state_dir), *extra,
        env=env,
    )  # fmt: skip
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
    log = platform_log(state_dir)
    assert "reconciler exited with -9; restarting it in" in log
    assert "api restarted (pid" in log
    # asked for its threads' stacks (what `down` asks before it kills), it writes them to its
    # log and runs on
    os.kill(int(state["pid"]), DUMP_SIGNAL)
    deadline = time.monotonic() + 10
    while "Current thread" not in (log := platform_log(state_dir)):
        assert time.monotonic() < deadline, "no stack dump in platform.log"
        time.sleep(0.1)
    assert "supervisor.py" in log and alive(int(state["pid"]))


def platform_log(state_dir: Path) -> str:
    return platform_log_path(state_dir).read_text(errors="replace")


def test_down_dumps_the_stacks_of_a_platform_that_does_not_stop(tmp_path: Path) -> None:
    """A supervisor that ignores SIGTERM is killed after the timeout, and where it was stuck
    is in its log first (faulthandler on DUMP_SIGNAL, as `up` sets it)."""
    platform_log_path(tmp_path).parent.mkdir()
    stuck = (
        "import faulthandler, signal, sys, time\n"
        f"faulthandler.register({int(DUMP_SIGNAL)}, all_threads=True)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "def wedged():\n    time.sleep(60)\n"
        "wedged()\n"
    )
    with platform_log_path(tmp_path).open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", stuck], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 10
        while "ready" not in platform_log(tmp_path):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (tmp_path / "platform.json").write_text(json.dumps({"pid": proc.pid}))
        assert down(tmp_path, timeout_s=1.0) == 2
        assert proc.wait(5) == -signal.SIGKILL
        log = platform_log(tmp_path)
        assert "Current thread" in log and "in wedged" in log
    finally:
        proc.kill()
        proc.wait()


def tcp_sockets(port: int) -> list[tuple[str, str]]:
    """(state, inode) of each IPv4 TCP socket on local `port`, whichever process holds it."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            found.append((fields[3], fields[9]))
    return found


def connections_served(pid: int, port: int) -> int:
    """Established TCP connections on local `port` whose socket the process `pid` holds."""
    established = "01"
    inodes = {f"socket:[{inode}]" for state, inode in tcp_sockets(port) if state == established}
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            held += os.readlink(fd) in inodes
    return held


def listeners(port: int) -> int:
    listening = "0A"
    return sum(state == listening for state, _ in tcp_sockets(port))


@pytest.mark.parametrize("own_platform", [("--api-processes", "2")], indirect=True)
def test_api_processes_share_the_port_and_heal_apart(own_platform: Any) -> None:
    state_dir, _env = own_platform
    state = state_of(state_dir)
    port = int(state["url"].rsplit(":", 1)[1])
    headers = {"Authorization": f"Bearer {state['api_key']}"}
    pids = {name: int(state["children"][name]) for name in ("api", "api-2")}
    # 24 keep-alive connections: the kernel spreads them between the two listening sockets
    clients = [httpx.Client(base_url=state["url"], headers=headers) for _ in range(24)]
    try:
        for c in clients:
            assert c.get("/v1/deployments").status_code == 200
        served = {name: connections_served(pid, port) for name, pid in pids.items()}
        assert sum(served.values()) == len(clients), served
        assert min(served.values()) > 0, served
    finally:
        for c in clients:
            c.close()
    # one dies: the other goes on serving, and the supervisor starts it again on the same port
    os.kill(pids["api-2"], signal.SIGKILL)
    # NOTE: a connection the kernel queued on the dying process's socket is reset, as with any
    # listener that dies; once it is gone (its socket closed), new ones all go to the other.
    # The process looking dead is not enough: its main thread turns zombie while its other
    # threads still exit, and the last of them closes the socket (seen in a full run).
    deadline = time.monotonic() + 10
    while alive(pids["api-2"]) or listeners(port) > 1:
        assert time.monotonic() < deadline, "api-2 did not die"
        time.sleep(0.01)
    for _ in range(20):
        assert httpx.get(state["url"] + "/v1/deployments", headers=headers).status_code == 200
    wait_restarted(state_dir, "api-2", pids["api-2"])
    assert alive(pids["api"])


def test_a_bad_api_process_count_is_refused_before_anything_starts(tmp_path: Path) -> None:
    state_dir = tmp_path / "platform"
    env = {**os.environ, "PLATFORM_STATE_DIR": str(state_dir), "PLATFORM_API_PROCESSES": "0"}
    up = cli("up", "--detach", "--port", str(free_port()), "--state-dir", str(state_dir), env=env)
    assert up.returncode == 1
    assert "PLATFORM_API_PROCESSES must be a whole number from 1 to 64, not '0'" in up.stderr
    assert processes_mentioning(str(state_dir)) == []

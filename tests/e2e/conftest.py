"""Fixtures of the end-to-end tests: one embedded platform (real processes) per session, and
a demo model built on disk."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.embedded.processes import free_port

BIN = Path(sys.executable).parent


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_mentioning(text: str) -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline and alive(int(entry.name)):
                out.append(f"{entry.name}: {cmdline}")
    return out


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "platform"), *args], env=env, capture_output=True, text=True, timeout=180
    )


def build_demo_model(out: Path) -> Path:
    """The demo model, untrained (every job then uses all its tokens), written to `out`."""
    subprocess.run(
        [sys.executable, "-m", "worker.model.demo", str(out), "--train-steps", "0"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def wait_for_usage(
    platform: dict[str, Any], deployment: str, expect_jobs: int
) -> list[dict[str, Any]]:
    """Usage rows once every job's busy time has been allocated (the loop does it)."""
    headers = {"Authorization": f"Bearer {platform['api_key']}"}
    deadline = time.monotonic() + 20
    while True:
        rows: list[dict[str, Any]] = httpx.get(
            platform["url"] + "/v1/usage", params={"deployment": deployment}, headers=headers
        ).json()["data"]
        done = [
            r for r in rows if r["status"] in ("succeeded", "failed") and Decimal(r["cost"]) > 0
        ]
        if len(done) >= expect_jobs or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("model") / "demo")


@contextlib.contextmanager
def embedded_platform(state_dir: Path, extra_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """`platform up --detach` on a free port; `platform down` at the end, after which no
    process mentioning `state_dir` may be left. Yields platform.json plus `env` (for the CLI
    and SDK: URL, admin key, the S3 endpoint and its keys) and `state_dir`."""
    port = free_port()
    env = {
        **os.environ,
        "PLATFORM_STATE_DIR": str(state_dir),
        # reach the workers through the control plane (PLATFORM_LOADER_*/ENGINE_* pass through)
        "PLATFORM_LOADER_CACHE_DIR": str(state_dir / "weights-cache"),
        # the host-memory tier in front of it (a plain directory here: same code path as /dev/shm)
        "PLATFORM_LOADER_HOST_CACHE_DIR": str(state_dir / "host-cache"),
        "PLATFORM_LOADER_HOST_CACHE_BYTES": str(1 << 30),
        "PLATFORM_ENGINE_MAX_NUM_BATCHED_TOKENS": "512",
        # the operator's tests deploy the demo model from its host path (other tenants never
        # may; test_platform_e2e uploads into the namespace as a tenant would)
        "PLATFORM_ALLOW_HOST_PATHS": "true",
        **extra_env,
    }
    up = cli("up", "--detach", "--port", str(port), "--state-dir", str(state_dir), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "Admin key:" in up.stdout and f"127.0.0.1:{port}" in up.stdout
    state = json.loads((state_dir / "platform.json").read_text())
    env.update(
        PLATFORM_URL=state["url"],
        PLATFORM_API_KEY=state["api_key"],
        PLATFORM_S3_ENDPOINT_URL=state["s3_endpoint_url"],
        AWS_ACCESS_KEY_ID=state["s3_access_key_id"],
        AWS_SECRET_ACCESS_KEY=state["s3_secret_access_key"],
        AWS_DEFAULT_REGION="us-east-1",
    )
    yield {**state, "env": env, "state_dir": state_dir}
    down = cli("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    deadline = time.monotonic() + 10
    while (left := processes_mentioning(str(state_dir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes left behind: {left}"


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The embedded platform for the e2e tests (`embedded_platform`)."""
    with embedded_platform(tmp_path_factory.mktemp("platform"), {}) as state:
        yield state

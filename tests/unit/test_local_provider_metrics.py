"""The local provider gives each worker a loopback metrics address by env (the worker reports
where it bound in its heartbeat), and never the control plane's own metrics directory."""

from __future__ import annotations

import time
from pathlib import Path

from common.protocol import METRICS_HOST_ENV, METRICS_PORT_ENV
from control_plane.providers.base import WorkerSpec
from control_plane.providers.local import LocalProvider, worker_env


def test_each_worker_gets_a_loopback_metrics_port_and_no_multiprocess_dir(tmp_path: Path) -> None:
    # a stand-in interpreter: writes the environment it was given, then exits
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nenv > "{tmp_path}/env-$4"\n')
    python.chmod(0o755)
    base = {"PATH": "/bin:/usr/bin", "PROMETHEUS_MULTIPROC_DIR": "/run/platform-metrics"}
    provider = LocalProvider(worker_env(base, {}), tmp_path / "logs", str(python))
    for wid in ("wrk_a", "wrk_b"):
        provider.start(WorkerSpec(wid, "cpu", None))
    deadline = time.monotonic() + 10
    while provider.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert {e.worker_id for e in provider.reap()} == {"wrk_a", "wrk_b"}
    envs = [
        dict(line.split("=", 1) for line in (tmp_path / f"env-{w}").read_text().splitlines())
        for w in ("wrk_a", "wrk_b")
    ]
    for env in envs:
        assert env[METRICS_HOST_ENV] == "127.0.0.1"
        assert 0 < int(env[METRICS_PORT_ENV]) < 65536
        assert "PROMETHEUS_MULTIPROC_DIR" not in env
    assert envs[0][METRICS_PORT_ENV] != envs[1][METRICS_PORT_ENV]

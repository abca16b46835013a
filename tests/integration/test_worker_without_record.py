"""A worker whose row does not exist exits at its first state report, before it loads or takes
any job: what a reconciler leaves behind when it is deposed in the middle of a start (its
process spawned, the transaction with its row ended by the database) stops by itself. The real
API served on loopback, a real `python -m worker` process against it."""

from __future__ import annotations

import os
import subprocess
import sys

from common.messages import ASSIGNMENT_ENV, Assignment
from common.protocol import deployment_queue
from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER_TOKEN, served


def test_a_worker_without_a_row_exits_before_it_loads(settings: Settings) -> None:
    with served(create_app(settings)) as address:
        # its weights are nowhere: a worker that went on to load would fail there instead
        assignment = Assignment("dep_missing", 1, "file:///nowhere/", deployment_queue("x"), 2)
        env = {
            **os.environ,
            "PLATFORM_INTERNAL_URL": f"http://{address}",
            "PLATFORM_WORKER_TOKEN": WORKER_TOKEN,
            "PLATFORM_REDIS_URL": settings.redis_url,
            "PLATFORM_LOG_FORMAT": "text",
            ASSIGNMENT_ENV: assignment.to_json(),
        }
        args = ["--worker-id", "wrk_never_committed", "--accelerator", "cpu"]
        proc = subprocess.run(
            [sys.executable, "-m", "worker", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "404" in out and "/internal/workers/wrk_never_committed/state" in out, out
    assert "nowhere" not in out, out  # it never began to load

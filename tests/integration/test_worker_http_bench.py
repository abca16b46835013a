"""bench/worker_http.py runs and reports each client (a smoke test: no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_reports_every_client() -> None:
    command = [sys.executable, str(ROOT / "bench" / "worker_http.py"), "--requests", "30"]
    out = subprocess.run(
        [*command, "--rounds", "2"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    last = json.loads(out.strip().splitlines()[-1])
    assert last["bench"] == "worker_http"
    assert set(last["us_per_request"]) == {"httpx", "http.client", "JsonHttp"}
    assert all(v > 0 for v in last["us_per_request"].values())

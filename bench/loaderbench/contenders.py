"""The parent side: each contender's environment, and one of its loads run in a fresh process
(`bench/loader.py --child ...`) with the S3 server's CPU seconds meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.loaderbench.checkpoint import BUCKET, KEY

ROOT = Path(__file__).resolve().parents[2]  # the repository
# The command line each load runs in: the bench's own script, which sets up sys.path for it.
SCRIPT = str(ROOT / "bench" / "loader.py")


def run_child(argv: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """`python argv` in a fresh process, after the page cache's writeback (no earlier run's
    files are written during this one); its last `RESULT {json}` line, parsed. SystemExit
    naming `what` when it fails."""
    os.sync()
    time.sleep(0.5)
    out = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def contenders(
    concurrency: list[int], target_gbps: float, loader_options: str = ""
) -> dict[str, dict[str, str]]:
    """Each contender's extra environment: the loader at its defaults and with each variant of
    `loader_options` (JSON: label -> LoadOptions fields), run:ai at its defaults and at each
    concurrency."""
    target = {"RUNAI_STREAMER_S3_TARGET_GBPS": f"{target_gbps:g}"} if target_gbps else {}
    variants = json.loads(loader_options or "{}")
    tuned = {f"loader {k}": {"BENCH_LOADER_OPTIONS": json.dumps(v)} for k, v in variants.items()}
    return {
        "loader": {},
        **tuned,
        "runai default": {},
        **{f"runai c={c}": {"RUNAI_STREAMER_CONCURRENCY": str(c), **target} for c in concurrency},
        "boto3 + load_file": {},
        "raw ceiling": {},
    }


CONTENDERS = contenders([1, 2, 4], 1)
KIND = {
    "loader": "loader",
    "boto3 + load_file": "boto3",
    "raw ceiling": "ceiling",
}


def run_one(label: str, s3_env: dict[str, str], size: int, server_pid: int) -> dict[str, float]:
    kind = "loader" if label.startswith("loader") else KIND.get(label, "runai")
    env = {
        **os.environ,
        **s3_env,
        "BENCH_ENV": json.dumps(CONTENDERS[label]),
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS": "60000",
        "RUNAI_STREAMER_LOG_LEVEL": "WARNING",
        "AWS_EC2_METADATA_DISABLED": "true",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    s0 = proc_cpu_s(server_pid)  # the server idles through run_child's writeback pause
    r = run_child([SCRIPT, "--child", kind, f"s3://{BUCKET}/{KEY}", str(size)], env, label)
    r["server_cpu_s"] = proc_cpu_s(server_pid) - s0
    return r

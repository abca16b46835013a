"""The embedded platform as real processes: redis-server, rclone S3, SQLite, uvicorn, Celery,
the autoscaler loop and worker processes. deploy → run → stream → async job + webhook →
billing → scale to zero → down, with no process left behind; `platform up` in the foreground
stopping every child on SIGTERM; two jobs at once on one worker billed exactly."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import threading
import time
from datetime import datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from control_plane.embedded.processes import free_port
from sdk import Client, webhooks
from tests.e2e.conftest import BIN, alive, cli, descendants, processes_mentioning, wait_for_usage

pytestmark = pytest.mark.e2e


def _t(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


class Receiver:
    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.deliveries.append((body, {k.lower(): v for k, v in self.headers.items()}))
                outer.arrived.set()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_deploy_run_stream_webhook_billing_scale_to_zero(
    platform: dict[str, Any], demo_model: Path
) -> None:
    env = platform["env"]
    up = cli("models", "upload", str(demo_model), "models/e2e/", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    # NOTE: the autoscaler keeps the last worker for min(boot + cold_penalty_s, window)
    # counted from the last *arrival* (docs/autoscaling.md), not from the end of the last job:
    # the window must outlast the first call's cold boot, or the worker may go between calls.
    dep = cli(
        "deploy", "--name", "e2e", "--model", "store://models/e2e/", "--scaledown-window", "15",
        env=env,
    )  # fmt: skip
    assert dep.returncode == 0, dep.stdout + dep.stderr

    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    assert client.workers.list(deployment="e2e") == []  # nothing runs while nobody calls

    text = client.run("e2e", input={"prompt": "The weather", "max_tokens": 12})
    assert isinstance(text, str) and text
    # the worker fills the cache tier the operator configured once it serves (off the cold
    # start's path): the next worker of this model on this host reads it
    weights = (demo_model / "model.safetensors").read_bytes()
    deadline = time.monotonic() + 30
    while not any(
        p.read_bytes() == weights
        for p in (platform["state_dir"] / "weights-cache").glob("*.safetensors")
    ):
        assert time.monotonic() < deadline, "the disk tier was never filled"
        time.sleep(0.2)

    deltas = list(client.run("e2e", input={"prompt": "The weather", "max_tokens": 12}, stream=True))
    assert len(deltas) >= 2
    assert "".join(deltas) == text, "greedy decoding: streamed text equals the plain run"

    receiver = Receiver()
    try:
        job = client.submit("e2e", input={"prompt": "Soup", "max_tokens": 8}, webhook=receiver.url)
        assert receiver.arrived.wait(60), "webhook did not arrive"
        body, headers = receiver.deliveries[0]
        secret = client.webhooks.secret()
        event = webhooks.verify(body, headers, secret)
        assert Webhook(secret).verify(body, headers)["data"]["id"] == job.id
        assert event["type"] == "job.completed" and event["data"]["status"] == "succeeded"
        final = job.wait(timeout=30)
        assert final.output is not None and final.output["text"] == event["data"]["output"]["text"]
        # the worker was warm with a free slot: the admission handed the job to it, claimed in
        # its own transaction (no claim request, so no later start)
        assert final.raw["started_at"] == final.raw["created_at"], final.raw
        deadline = time.monotonic() + 10
        while client.jobs.get(job.id).webhook_status != "delivered":
            assert time.monotonic() < deadline, "webhook_status never became delivered"
            time.sleep(0.2)
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()

    # Scale to zero after the 15 s window.
    deadline = time.monotonic() + 60
    while any(w["state"] not in ("stopped", "failed") for w in client.workers.list("e2e")):
        assert time.monotonic() < deadline, "did not scale to zero"
        time.sleep(0.3)
    workers = client.workers.list("e2e")
    assert [w["state"] for w in workers] == ["stopped"], "one worker served all three calls"

    records = client.billing.records(deployment="e2e")
    phases = [r["phase"] for r in records]
    # a worker booted for it, or the warm pool's (booted ahead: its boot is the platform's);
    # no warm-up: the first call was waiting for it
    startup = ["load"] if phases[0] == "load" else ["boot", "load"]
    assert phases[: len(startup)] == startup and phases[-1] == "drain", phases
    assert "warm" not in phases, phases
    # a busy segment per call, or fewer: calls closer than a reconciler tick share one (the
    # worker goes back to idle at the tick after its job ended); each job's cost comes from one
    assert 1 <= phases.count("busy") <= 3, phases
    # Segments tile the worker's life: each starts where the previous ended.
    for a, b in itertools.pairwise(records):
        assert a["end"] == b["start"]
    for r in records:
        assert Decimal(r["amount"]) == (
            Decimal(r["billed_seconds"]) * Decimal(r["rate_per_s"])
        ).quantize(Decimal("0.000000001"))
    # Every wall-clock second of the worker is accounted for.
    worker = workers[0]
    life = (_t(worker["stopped_at"]) - _t(worker["started_at"])).total_seconds()
    covered = sum(float(r["seconds"]) for r in records)
    assert abs(covered - life) <= 0.01 * len(records) + 0.01
    # Job costs + the rest (boot, load, warm, idle, drain) = the worker's cost, exactly.
    usage = wait_for_usage(platform, "e2e", expect_jobs=3)
    other = sum(Decimal(r["amount"]) for r in records if r["phase"] != "busy")
    total = sum(Decimal(r["amount"]) for r in records)
    assert sum(Decimal(u["cost"]) for u in usage) + other == total
    assert all(Decimal(u["cost"]) > 0 for u in usage)
    check = httpx.get(
        platform["url"] + "/v1/billing/check",
        headers={"Authorization": f"Bearer {platform['api_key']}"},
    ).json()
    assert check["ok"], check


def test_foreground_up_stops_every_child_on_sigterm(
    tmp_path: Path, demo_model: Path, platform: dict[str, Any]
) -> None:
    """`platform up` in the foreground; a worker is running; SIGTERM leaves no process behind."""
    state_dir = tmp_path / "fg"
    port = free_port()
    env = {k: v for k, v in platform["env"].items() if not k.startswith("PLATFORM_")}
    env["PLATFORM_ALLOW_HOST_PATHS"] = "true"  # the operator deploys the demo from its path
    proc = subprocess.Popen(
        [str(BIN / "platform"), "up", "--port", str(port), "--state-dir", str(state_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (state_dir / "platform.json").exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.1)
        state = json.loads((state_dir / "platform.json").read_text())
        client = Client(base_url=state["url"], api_key=state["api_key"], timeout=120)
        client.deployments.create(
            name="fg", model=str(demo_model), scaledown_window_s=600, max_workers=1
        )
        assert client.run("fg", input={"prompt": "hi", "max_tokens": 2})
        assert httpx.get(state["url"] + "/healthz").status_code == 200
        tree = descendants(proc.pid)
        # Only this platform's children, found by the worker's id (its command line names no
        # model: the assignment is in its environment).
        (worker,) = client.workers.list("fg")
        worker_procs = [
            p
            for p in processes_mentioning(worker["id"])
            if "-m worker" in p and int(p.split(":")[0]) in tree
        ]
        assert len(worker_procs) == 1, "a worker process serves the deployment"
        assert len(tree) >= 6  # redis, s3, api, celery, loops, worker (+ helpers)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        time.sleep(0.5)
        left = [p for p in tree if alive(p)]
        assert left == [], f"orphans after SIGTERM: {left}"
        assert processes_mentioning(str(state_dir)) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_overlapping_jobs_on_one_worker_are_billed_exactly(
    platform: dict[str, Any], demo_model: Path
) -> None:
    """Scale from zero, two jobs at once in one worker's engine, idle, scale to zero: the
    records cover the worker's life and job costs + the other phases = the worker's cost."""
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(
        name="overlap", model=str(demo_model), target_concurrency=2, max_workers=1,
        scaledown_window_s=2,
    )  # fmt: skip
    jobs = [
        client.submit("overlap", input={"prompt": p, "max_tokens": 200})
        for p in ("The weather", "A good soup")
    ]
    finished = [j.wait(timeout=120) for j in jobs]
    assert all(j.status == "succeeded" for j in finished)
    (a, b) = finished
    assert (
        a.raw["started_at"] < b.raw["completed_at"] and b.raw["started_at"] < a.raw["completed_at"]
    )
    deadline = time.monotonic() + 60
    while any(w["state"] not in ("stopped", "failed") for w in client.workers.list("overlap")):
        assert time.monotonic() < deadline, "did not scale to zero"
        time.sleep(0.3)
    (worker,) = client.workers.list("overlap")
    records = client.billing.records(deployment="overlap")
    life = (_t(worker["stopped_at"]) - _t(worker["started_at"])).total_seconds()
    assert abs(sum(float(r["seconds"]) for r in records) - life) <= 0.01 * len(records) + 0.01
    usage = wait_for_usage(platform, "overlap", expect_jobs=2)
    costs = [Decimal(u["cost"]) for u in usage]
    assert len(costs) == 2 and all(c > 0 for c in costs)
    other = sum(Decimal(r["amount"]) for r in records if r["phase"] != "busy")
    assert sum(costs) + other == sum(Decimal(r["amount"]) for r in records)

"""`make demo`: the main job end to end on the embedded platform, then everything stops.

platform up → create the demo model → upload it to the object store → platform deploy →
client.run (plain, then streamed) → async job with a webhook to a local receiver →
billing records → wait for scale to zero → platform down.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from control_plane.embedded.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".demo"
STATE = WORK / "state"
MODEL_DIR = WORK / "demo-model"
BIN = Path(sys.executable).parent
SCALEDOWN_WINDOW_S = 5


def step(title: str) -> None:
    print(f"\n==> {title}", flush=True)


def platform(*args: str, env: dict[str, str] | None = None) -> None:
    cmd = [str(BIN / "platform"), *args]
    print("$ platform " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, env=env)


class Receiver:
    """A local webhook receiver that verifies every delivery's signature."""

    def __init__(self, secret: str) -> None:
        from sdk import webhooks

        self.events: list[dict[str, Any]] = []
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    event = webhooks.verify(body, dict(self.headers.items()), secret)
                except Exception as exc:
                    print(f"    webhook rejected: {exc}", flush=True)
                    self.send_response(400)
                    self.end_headers()
                    return
                outer.events.append(event)
                outer.arrived.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/platform"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> int:
    t_start = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    port = free_port()
    step("Start the embedded platform (redis-server, rclone S3, SQLite, API, Celery, autoscaler)")
    platform("up", "--detach", "--port", str(port), "--state-dir", str(STATE))
    try:
        return run_demo(port, t_start)
    finally:
        step("Shut everything down")
        platform("down", "--state-dir", str(STATE))


def run_demo(port: int, t_start: float) -> int:
    from sdk import Client

    state = json.loads((STATE / "platform.json").read_text())
    env = {
        **os.environ,
        "PLATFORM_URL": state["url"],
        "PLATFORM_API_KEY": state["api_key"],
    }

    step("Create the demo model (small Llama, tokenizer trained on text shipped in the repo)")
    platform("models", "create-demo", str(MODEL_DIR), env=env)

    step("Upload it into this tenant's namespace (through the API: no storage credentials)")
    platform("models", "upload", str(MODEL_DIR), "models/demo/", env=env)

    step("Deploy it (scale to zero after a short idle window)")
    platform(
        "deploy", "--name", "demo", "--model", "store://models/demo/", "--accelerator", "cpu",
        "--min-workers", "0", "--max-workers", "1", "--scaledown-window", str(SCALEDOWN_WINDOW_S),
        "--max-tokens", "48", env=env,
    )  # fmt: skip

    client = Client(base_url=state["url"], api_key=state["api_key"], timeout=120)

    step("client.run — the first call boots a worker from zero")
    t0 = time.monotonic()
    text = client.run("demo", input={"prompt": "The weather today", "max_tokens": 32})
    print(f"    output ({time.monotonic() - t0:.1f}s, cold start included): {text!r}")

    step("client.run(stream=True) — tokens as they arrive")
    print("    ", end="", flush=True)
    for delta in client.run(
        "demo", input={"prompt": "A good soup needs", "max_tokens": 32}, stream=True
    ):
        print(delta, end="", flush=True)
    print()

    step("Async job with a signed webhook to a local receiver")
    receiver = Receiver(client.webhooks.secret())
    try:
        job = client.submit(
            "demo", input={"prompt": "Serverless GPUs", "max_tokens": 24}, webhook=receiver.url
        )
        print(f"    submitted {job.id} ({job.status})")
        if not receiver.arrived.wait(120):
            print("    no webhook arrived within 120s", file=sys.stderr)
            return 1
        event = receiver.events[0]
        print(
            f"    webhook {event['type']} verified (Standard Webhooks signature): "
            f"status={event['data']['status']} output={event['data']['output']['text']!r}"
        )
    finally:
        receiver.close()

    step(f"Wait for scale to zero ({SCALEDOWN_WINDOW_S}s idle window)")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        live = [
            w
            for w in client.workers.list(deployment="demo")
            if w["state"] not in ("stopped", "failed")
        ]
        if not live:
            break
        time.sleep(0.5)
    else:
        print("    the deployment did not scale to zero within 120s", file=sys.stderr)
        return 1
    print("    no worker runs for 'demo' any more")

    step("Per-second billing records (every second of every worker, by phase)")
    records = client.billing.records(deployment="demo")
    print(f"    {'worker':<28} {'phase':<6} {'seconds':>9} {'rate/s':>12} {'amount':>13}")
    total = Decimal(0)
    for r in records:
        total += Decimal(r["amount"])
        print(
            f"    {r['worker_id']:<28} {r['phase']:<6} {r['seconds']:>9} {r['rate_per_s']:>10} "
            f"{r['amount']:>13}"
        )
    print(f"    {'total':<28} {'':<6} {'':>9} {'':>12} {total:>13f} USD")

    step("Where the seconds went: per-job usage and cost by phase")
    platform("usage", "--by", "phase", env=env)

    print(f"\nDemo finished in {time.monotonic() - t_start:.0f}s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

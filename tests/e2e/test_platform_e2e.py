"""The embedded platform as real processes: redis-server, rclone S3, SQLite, uvicorn, Celery,
the autoscaler loop and worker processes. deploy → run → stream → async job + webhook →
billing → scale to zero → down, with no process left behind."""

from __future__ import annotations

import itertools
import json
import os
import shutil
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
from sdk import Client, InvalidRequestError, webhooks
from tests.e2e.conftest import BIN, alive, cli, descendants, processes_mentioning

pytestmark = pytest.mark.e2e


def _t(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


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
        # Only this platform's children: other deployments of the shared demo model run too.
        worker_procs = [
            p
            for p in processes_mentioning(str(demo_model))
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


def test_unloadable_model_fails_calls_fast_with_a_clear_error(
    platform: dict[str, Any], demo_model: Path, tmp_path: Path
) -> None:
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    # A model that does not exist is refused when it is deployed (PLATFORM_VALIDATE_MODELS) ...
    with pytest.raises(InvalidRequestError, match="does not exist or is not readable"):
        client.deployments.create(name="broken", model="store://models/does-not-exist/")
    # ... and one whose weights disappear after the deploy fails its calls fast in the worker.
    model = tmp_path / "does-not-exist"
    shutil.copytree(demo_model, model)
    client.deployments.create(name="broken", model=str(model))
    (model / "model.safetensors").unlink()
    job = client.submit("broken", input={"prompt": "hi", "max_tokens": 2})
    t0 = time.monotonic()
    final = client.jobs.get(job.id)
    while final.status not in ("failed", "succeeded"):
        assert time.monotonic() - t0 < 90, f"job still {final.status}"
        time.sleep(0.3)
        final = client.jobs.get(job.id)
    assert final.status == "failed"
    assert final.error is not None and final.error["type"] == "deployment_unavailable"
    assert "ObjectNotFound" in final.error["message"]
    assert "does-not-exist" in final.error["message"]
    states = [w["state"] for w in client.workers.list("broken")]
    assert states and set(states) == {"failed"}


def test_job_of_a_killed_worker_is_retried_once_and_billed_for_its_worker(
    platform: dict[str, Any], demo_model: Path
) -> None:
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name="kill", model=str(demo_model), scaledown_window_s=600)
    # Warm a worker, then find its process.
    assert client.run("kill", input={"prompt": "warm", "max_tokens": 1})
    procs = processes_mentioning(str(demo_model))
    ids = {w["id"] for w in client.workers.list("kill")}
    victim = [p for p in procs if "-m worker" in p and any(i in p for i in ids)]
    assert len(victim) == 1
    pid = int(victim[0].split(":")[0])

    job = client.submit("kill", input={"prompt": "The weather", "max_tokens": 400})
    deadline = time.monotonic() + 30
    while client.jobs.get(job.id).status != "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    final = job.wait(timeout=120)
    assert final.status == "succeeded" and final.attempt == 2
    expected = client.run("kill", input={"prompt": "The weather", "max_tokens": 400})
    assert final.output is not None and final.output["text"] == expected
    workers = client.workers.list("kill")
    states = {w["state"] for w in workers}
    assert "failed" in states and states - {"failed"} <= {"idle", "busy"}
    # Billing: the killed worker's open segment was closed; the lost attempt is not billed;
    # the retried job is billed once, for its second attempt only.
    dead = next(w for w in workers if w["state"] == "failed")
    dead_recs = client.billing.records(worker_id=dead["id"])
    assert dead_recs and dead_recs[-1]["end"] <= dead["stopped_at"]
    usage = next(
        u for u in wait_for_usage(platform, "kill", expect_jobs=3) if u["job_id"] == job.id
    )
    assert usage["attempt"] == 2 and dead["id"] in usage["workers"]
    live_id = next(w["id"] for w in workers if w["state"] != "failed")
    assert Decimal(usage["cost"]) > 0 and live_id in usage["workers"]


def test_streaming_client_that_disconnects_cancels_its_job(
    platform: dict[str, Any], demo_model: Path
) -> None:
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name="gone", model=str(demo_model), scaledown_window_s=600)
    assert client.run("gone", input={"prompt": "warm", "max_tokens": 1})  # a worker is up
    # Keep the only slot busy so the streamed job is still waiting when its client leaves.
    busy = client.submit("gone", input={"prompt": "The weather", "max_tokens": 480})
    headers = {"Authorization": f"Bearer {platform['api_key']}"}
    body = {"input": {"prompt": "A good soup", "max_tokens": 480}, "stream": True}
    with (
        httpx.Client(base_url=platform["url"], timeout=30) as http,
        http.stream("POST", "/v1/deployments/gone/run", json=body, headers=headers) as resp,
    ):
        job_id = resp.headers["X-Job-Id"]
        for line in resp.iter_lines():
            if line.startswith("event:"):
                break  # the first event arrived; now the client goes away
    deadline = time.monotonic() + 20
    while (status := client.jobs.get(job_id).status) != "canceled":
        assert status in ("running", "queued", "starting"), status
        assert time.monotonic() < deadline, "the job was not canceled"
        time.sleep(0.1)
    assert busy.wait(timeout=60).status == "succeeded", "other work is unaffected"


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


def test_a_cold_start_reports_its_phases_and_the_next_worker_reads_the_host_tier(
    platform: dict[str, Any], demo_model: Path
) -> None:
    from sdk import RunStatus

    env = platform["env"]
    up = cli("models", "upload", str(demo_model), "models/tiers/", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name="tier-a", model="store://models/tiers/")
    seen: list[RunStatus] = []
    stream = client.run(
        "tier-a", {"prompt": "Hi", "max_tokens": 4}, stream=True, on_status=seen.append
    )
    "".join(stream)
    assert stream.job is not None and stream.job.status == "succeeded"
    statuses = [(s.status, s.phase) for s in seen]
    assert statuses[0] == ("queued", None) and statuses[-1] == ("running", None)
    # a worker boots for it, or the warm pool's worker is given to it
    assert statuses[1] in {("starting", "booting"), ("starting", "assigning_warm_worker")}
    assert all(s.status == "starting" for s in seen[1:-1])

    # once serving, the first worker fills host memory (off its cold start's path) ...
    from loader import cached_uris

    def in_host_tier() -> bool:
        return any("/models/tiers/" in u for u in cached_uris(str(tier_dir)))

    tier_dir = platform["state_dir"] / "host-cache"
    deadline = time.monotonic() + 60
    while not in_host_tier():
        assert time.monotonic() < deadline, "the host tier was never filled"
        time.sleep(0.2)
    # ... and another deployment of the same model reads its weights from there
    client.deployments.create(name="tier-b", model="store://models/tiers/")
    assert client.run("tier-b", {"prompt": "Hi", "max_tokens": 4}) is not None
    (worker,) = client.workers.list(deployment="tier-b")
    log = (platform["state_dir"] / "logs" / "workers" / f"{worker['id']}.log").read_text()
    assert "cache hits {'host': 1}" in log, log[-2000:]
    for name in ("tier-a", "tier-b"):
        client.deployments.delete(name)


def test_a_worker_scaled_down_during_its_first_jobs_still_fills_the_host_tier(
    platform: dict[str, Any], demo_model: Path
) -> None:
    """Asked to drain (SIGTERM, as a scale-down does) while its first jobs run (the fill waits
    for quiet): the worker finishes them, reports stopped (its tenant's records end there),
    then finishes the fill before it exits."""
    from loader import cached_uris

    up = cli("models", "upload", str(demo_model), "models/fill-exit/", env=platform["env"])
    assert up.returncode == 0, up.stdout + up.stderr
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(
        name="fill-exit", model="store://models/fill-exit/", max_workers=1, target_concurrency=4
    )
    # the untrained demo model generates every one of its max_tokens: four long jobs, together
    jobs = [client.submit("fill-exit", {"prompt": "Hi", "max_tokens": 400}) for _ in range(4)]
    deadline = time.monotonic() + 90
    while any(client.jobs.get(j.id).status != "running" for j in jobs):
        assert time.monotonic() < deadline, "the jobs never ran together"
        time.sleep(0.02)
    (worker,) = client.workers.list(deployment="fill-exit")
    (proc,) = processes_mentioning(worker["id"])
    os.kill(int(proc.split(":", 1)[0]), signal.SIGTERM)  # what the provider's stop sends
    assert all(j.wait(timeout=60).status == "succeeded" for j in jobs), "the drain ran them"

    tier_dir = platform["state_dir"] / "host-cache"
    deadline = time.monotonic() + 60
    while not any("/models/fill-exit/" in u for u in cached_uris(str(tier_dir))):
        assert time.monotonic() < deadline, "the host tier was never filled"
        time.sleep(0.2)
    log_path = platform["state_dir"] / "logs" / "workers" / f"{worker['id']}.log"
    log = log_path.read_text()
    assert "finishing the cache-tier fill before exiting" in log, log[-2000:]
    # the fill came after `stopped`: the tenant's records end before it
    # (the deployment lives on: the autoscaler may have started another worker meanwhile)
    (stopped,) = (w for w in client.workers.list(deployment="fill-exit") if w["id"] == worker["id"])
    assert stopped["state"] == "stopped"
    records = client.billing.records(worker_id=worker["id"])
    assert records[-1]["phase"] == "drain" and records[-1]["end"] == stopped["stopped_at"]
    client.deployments.delete("fill-exit")


def test_jobs_that_start_and_end_together_share_their_claims_and_reports(
    platform: dict[str, Any], demo_model: Path
) -> None:
    """A burst queued behind a cold start: what the worker sends the control plane while other
    requests of the same kind are under way goes together, in fewer requests than jobs, each
    job still ending once with its own output. Its reports of the jobs one engine step ends go
    together; its claims go together only when deliveries come faster than claims are
    answered. The consumer takes a wake-up as soon as a slot frees, one at a time, so on a
    loopback control plane that happens in some runs and not in others."""
    from prometheus_client.parser import text_string_to_metric_families

    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(
        name="together", model=str(demo_model), max_workers=1, target_concurrency=8
    )
    jobs = [client.submit("together", {"prompt": "Hi", "max_tokens": 3}) for _ in range(24)]
    done = [j.wait(timeout=120) for j in jobs]
    assert [j.status for j in done] == ["succeeded"] * 24
    assert all(j.output["text"] and j.raw["attempt"] == 1 for j in done)
    headers = {"Authorization": f"Bearer {platform['api_key']}"}
    groups = httpx.get(f"{platform['url']}/metrics/workers", headers=headers).json()
    (target,) = [g["targets"][0] for g in groups if g["labels"].get("deployment") == "together"]
    sent: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"http://{target}/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("platform_worker_control_") and sample.name.endswith(
                "_total"
            ):
                sent[(sample.name, sample.labels["call"])] = sample.value
    for call in ("claim", "report"):
        jobs_sent = sent[("platform_worker_control_jobs_total", call)]
        requests = sent[("platform_worker_control_requests_total", call)]
        assert jobs_sent >= 24 and requests <= jobs_sent, (call, sent)
    requests = sum(v for (name, _), v in sent.items() if "_requests_" in name)
    jobs_sent = sum(v for (name, _), v in sent.items() if "_jobs_" in name)
    assert requests < jobs_sent, f"nothing went together: {sent}"
    client.deployments.delete("together")

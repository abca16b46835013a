"""Failures on the embedded platform (real processes): a model that cannot load fails its calls
fast with a clear error, a killed worker's job is retried once and billed for its workers, and
a streaming client that disconnects cancels its job."""

from __future__ import annotations

import os
import shutil
import signal
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import Client, InvalidRequestError
from tests.e2e.conftest import processes_mentioning, wait_for_usage

pytestmark = pytest.mark.e2e


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
    # By its id, not by the model: a warm pool's worker given to the deployment (there is one
    # when an earlier test left the pool filled) was started naming no model.
    ids = {w["id"] for w in client.workers.list("kill")}
    victim = [p for i in ids for p in processes_mentioning(i) if "-m worker" in p]
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

"""Logs of the embedded platform (real processes): JSON lines from every platform process, with
the ids that join them, and never a prompt or an output, whatever path a call takes (sync,
streamed, async with a webhook, batch, OpenAI chat, and input the API refuses)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import Client
from tests.e2e.conftest import embedded_platform
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

SECRET = "quokka-marmalade-5531"  # in every prompt below; must be in no log
PROMPT = f"Tell {SECRET} about the weather"
REQUEST_ID = "e2e-logs-1"
# the platform's own processes (redis-server and rclone write their own formats)
PLATFORM_LOGS = ("api*.log", "celery.log", "reconciler.log", "workers/*.log")
REQUIRED = {"timestamp", "level", "component", "logger", "message", "pid"}


@pytest.fixture(scope="module", params=["INFO", "DEBUG"])
def platform(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    """A platform of its own, at the default level and at DEBUG: its logs hold only this
    file's calls."""
    env = {
        "PLATFORM_LOG_LEVEL": request.param,
        "PLATFORM_LOG_LEVELS": "",
        "PLATFORM_LOG_FORMAT": "json",
    }
    with embedded_platform(tmp_path_factory.mktemp("logs-platform"), env) as state:
        yield state


class _Receiver:
    """A webhook receiver on loopback; `arrived` is set by the first delivery."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                self.send_response(200)
                self.end_headers()
                outer.arrived.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _lines(state_dir: Path) -> list[dict[str, Any]]:
    """Every line of the platform processes' logs, each checked to be a JSON object."""
    out = []
    for pattern in PLATFORM_LOGS:
        for path in sorted((state_dir / "logs").glob(pattern)):
            for n, text in enumerate(path.read_text().splitlines(), 1):
                if not text.strip():
                    continue
                try:
                    line = json.loads(text)
                except ValueError:
                    pytest.fail(f"{path.name}:{n} is not JSON: {text[:300]}")
                assert isinstance(line, dict) and line.keys() >= REQUIRED, (path.name, line)
                out.append(line)
    return out


def _wait_for_line(
    state_dir: Path, what: str, match: Any, timeout_s: float = 30
) -> list[dict[str, Any]]:
    """Every log line, once one of them matches."""

    def matched() -> list[dict[str, Any]] | None:
        lines = _lines(state_dir)
        return lines if any(match(x) for x in lines) else None

    return wait_for(matched, timeout_s, every_s=0.3, what=f"a log line for {what}")


def test_json_logs_join_by_ids_and_hold_no_prompt_or_output(
    platform: dict[str, Any], demo_model: Path, tmp_path: Path
) -> None:
    state_dir: Path = platform["state_dir"]
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name="logs", model=str(demo_model), scaledown_window_s=600)
    auth = {"Authorization": f"Bearer {platform['api_key']}"}
    api = httpx.Client(base_url=platform["url"], headers=auth, timeout=120)
    outputs: list[str] = []

    # sync, with the caller's request id
    r = api.post(
        "/v1/deployments/logs/run",
        json={"input": {"prompt": PROMPT, "max_tokens": 12}},
        headers={"x-request-id": REQUEST_ID},
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == REQUEST_ID
    sync_id = r.headers["x-job-id"]
    outputs.append(r.json()["output"]["text"])

    # streamed
    with client.run("logs", {"prompt": PROMPT, "max_tokens": 12}, stream=True) as stream:
        outputs.append("".join(stream))
    assert stream.job is not None and stream.job.status == "succeeded"

    # async, with a webhook (sent by the Celery worker)
    receiver = _Receiver()
    try:
        job = client.submit("logs", {"prompt": PROMPT, "max_tokens": 8}, webhook=receiver.url)
        assert receiver.arrived.wait(60), "webhook did not arrive"
        assert job.wait(timeout=60).status == "succeeded"
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()

    # a batch
    source = tmp_path / "in.jsonl"
    source.write_text(
        json.dumps({"prompt": PROMPT, "max_tokens": 4})
        + "\n"
        + json.dumps({"prompt": SECRET})
        + "\n"
    )
    batch = client.batches.create(source, deployment="logs", max_in_flight=2)
    batch.wait(timeout=120)
    assert batch.status == "completed"

    # OpenAI chat
    r = api.post(
        "/v1/chat/completions",
        json={"model": "logs", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8},
    )
    assert r.status_code == 200, r.text
    outputs.append(r.json()["choices"][0]["message"]["content"])

    # refused input, with the secret in it, and a malformed body
    bad = [
        ("/v1/deployments/logs/run", {"input": {"prompt": PROMPT, "max_tokens": "lots"}}),
        ("/v1/deployments/logs/jobs", {"input": {"prompt": PROMPT}, "extra": SECRET}),
        ("/v1/chat/completions", {"model": "logs", "messages": [{"role": SECRET}]}),
    ]
    for path, body in bad:
        assert api.post(path, json=body).status_code in (400, 422), path
    r = api.post("/v1/deployments/logs/run", content=b'{"input": {"prompt": "' + SECRET.encode())
    assert r.status_code == 422 and r.headers["x-request-id"].startswith("req_")
    r = api.post("/v1/deployments/logs/run", headers={"x-request-id": f"{SECRET} !"}, json={})
    assert r.headers["x-request-id"] != f"{SECRET} !"  # unsafe: replaced, never logged

    # the worker logs a job's end after the control plane took its report
    lines = _wait_for_line(
        state_dir,
        "the sync job in the worker",
        lambda x: x["component"] == "worker" and x.get("job_id") == sync_id,
    )

    # no prompt, no output, in any file of the logs (the stores' own logs included)
    texts = [o for o in outputs if len(o.strip()) >= 12]
    for path in (state_dir / "logs").rglob("*"):
        if path.is_file():
            data = path.read_text(errors="replace")
            assert SECRET not in data, f"the prompt is in {path}"
            for text in texts:
                assert text not in data, f"an output is in {path}"

    # every process logged, as JSON lines with its component
    assert {x["component"] for x in lines} >= {"api", "celery", "reconciler", "worker"}
    # the sync run: the API's request line (with the caller's id), its end, and the worker
    request = [x for x in lines if x.get("request_id") == REQUEST_ID and "route" in x]
    assert request and request[-1]["job_id"] == sync_id, request
    assert request[-1]["route"] == "/v1/deployments/{name}/run"
    assert request[-1]["status_code"] == 200 and request[-1]["duration_s"] > 0
    ended = [x for x in lines if x["component"] == "api" and x.get("job_id") == sync_id]
    assert any(x.get("status") == "succeeded" and "duration_s" in x for x in ended), ended
    in_worker = [x for x in lines if x["component"] == "worker" and x.get("job_id") == sync_id]
    assert in_worker[-1]["worker_id"] and in_worker[-1]["deployment_id"]
    # the webhook's delivery, in the Celery worker, names its job
    assert any(x["component"] == "celery" and x.get("job_id") == job.id for x in lines)
    # the batch: created in the API, pumped by the reconciler
    assert any(x["component"] == "api" and x.get("batch_id") == batch.id for x in lines)
    assert any(x["component"] == "reconciler" and x.get("batch_id") == batch.id for x in lines)
    # the reconciler's scaling lines name the deployment and why
    started = [
        x
        for x in lines
        if x["logger"] == "control_plane.reconcile.worker_actions"
        and x["message"].startswith("started")
    ]
    assert started and started[0]["deployment_id"] and started[0]["reason"]
    # refused requests are logged as such
    assert any(x.get("status_code") == 422 for x in lines)
    client.deployments.delete("logs")

"""What the webhook tests share: the environment the package's `env` fixture builds (the API in
process, a Celery worker process, a receiver) and the steps of a job's life driven through the
API (deploy, submit, claim and complete as the worker would), read back (the job, its delivery
log) and checked (a signature, with `standardwebhooks`)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from common.protocol import UNACKED_KEY
from control_plane.providers.local import die_with_parent
from control_plane.services.jobs.dispatch import make_celery
from control_plane.settings import Settings
from control_plane.tasks_api import CONTROL_QUEUE, DELIVER_WEBHOOK_TASK
from tests.helpers import wait_for
from tests.integration.api_helpers import WORKER, h
from tests.integration.webhooks.receiver import Received, Receiver

# Redis database of these tests (others flush database 0 between tests).
REDIS_DB = 3
OUTPUT_INTERVAL_S = 0.4
RETRY_SCHEDULE_S = "[0.2,0.2,0.2]"
WAIT_S = 20.0


@dataclass
class Env:
    client: TestClient  # the API (allow_private: the receiver is on loopback)
    settings: Settings
    receiver: Receiver
    worker: subprocess.Popen[bytes]  # the Celery worker process
    log: Path  # its log
    metrics_port: int | None = None  # its own /metrics (PLATFORM_METRICS_PORT); None: none

    def wait(self, what: str, check: Callable[[], Any]) -> Any:
        """`check()` once it is truthy (`wait_on_worker`)."""
        return wait_on_worker(self.worker, self.log, what, check, WAIT_S)

    def tail(self) -> str:
        return _tail(self.log)


def wait_on_worker(
    worker: subprocess.Popen[bytes],
    log: Path,
    what: str,
    check: Callable[[], Any],
    timeout_s: float,
) -> Any:
    """`check()` once it is truthy; fails at once if the Celery worker exited, and with the
    tail of its log either way."""

    def checked() -> Any:
        value = check()
        if not value and worker.poll() is not None:
            pytest.fail(f"celery worker exited ({worker.returncode}):\n{_tail(log)}")
        return value

    try:
        return wait_for(checked, timeout_s, what=what)
    except AssertionError as e:
        pytest.fail(f"{e}; worker log:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


def start_celery_worker(
    child_env: dict[str, str], log: Path, settings: Settings
) -> subprocess.Popen[bytes]:
    """The control plane's Celery worker as the platform runs it (`-P threads`), its output in
    `log`; it dies with this process. Back once it consumes its queue (`settings`' broker)."""
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "control_plane.tasks", "worker",
             "-Q", CONTROL_QUEUE, "-P", "threads", "-c", "2", "-l", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=Path(__file__).resolve().parents[3],
            start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    try:
        _wait_until_consuming(worker, log, settings)
    except BaseException:
        stop_celery_worker(worker)
        raise
    return worker


def _wait_until_consuming(worker: subprocess.Popen[bytes], log: Path, settings: Settings) -> None:
    """Until the worker has taken a task off its queue and finished it: a delivery of a job
    that does not exist, which does nothing. Its start takes seconds, more on a loaded machine,
    and a test with a timeline of its own (the output follower's) assumes it runs."""
    r = redis.Redis.from_url(settings.redis_url)
    app = make_celery(settings)
    try:
        app.send_task(
            DELIVER_WEBHOOK_TASK,
            kwargs={"event_type": "job.completed", "msg_id": "msg_ready", "attempt": 1,
                    "job_id": "job_that_does_not_exist"},
            queue=CONTROL_QUEUE,
        )  # fmt: skip
        wait_on_worker(
            worker,
            log,
            "the Celery worker's first task",
            lambda: r.llen(CONTROL_QUEUE) == 0 and r.hlen(UNACKED_KEY) == 0,
            60,
        )
    finally:
        app.close()
        r.close()


def stop_celery_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def unique(prefix: str) -> str:
    return f"{prefix}/{random.getrandbits(40):x}"


def deploy(env: Env, key: str) -> None:
    spec = {"name": "demo", "model": "store://models/demo/"}
    assert env.client.post("/v1/deployments", json=spec, headers=h(key)).status_code == 201


def submit(env: Env, key: str, url: str, events: list[str] | None = None) -> str:
    body: dict[str, Any] = {"input": {"prompt": "hi"}, "webhook": url}
    if events is not None:
        body["webhook_events"] = events
    r = env.client.post("/v1/deployments/demo/jobs", json=body, headers=h(key))
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    return job_id


def claim(env: Env, job_id: str) -> int:
    r = env.client.post(f"/internal/jobs/{job_id}/claim", json={"worker_id": "w"}, headers=WORKER)
    assert r.status_code == 200, r.text
    attempt: int = r.json()["attempt"]
    return attempt


def complete(env: Env, job_id: str, attempt: int, text: str = "the answer") -> None:
    body = {
        "worker_id": "w",
        "attempt": attempt,
        "status": "succeeded",
        "output": {"text": text, "finish_reason": "stop"},
    }
    r = env.client.post(f"/internal/jobs/{job_id}/complete", json=body, headers=WORKER)
    assert r.status_code == 200, r.text


def job(env: Env, key: str, job_id: str) -> dict[str, Any]:
    out: dict[str, Any] = env.client.get(f"/v1/jobs/{job_id}", headers=h(key)).json()
    return out


def deliveries(env: Env, key: str, job_id: str) -> list[dict[str, Any]]:
    r = env.client.get(f"/v1/jobs/{job_id}/webhook/deliveries", headers=h(key))
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def verify(secret: str, r: Received) -> dict[str, Any]:
    out: dict[str, Any] = Webhook(secret).verify(r.body, r.headers)
    return out

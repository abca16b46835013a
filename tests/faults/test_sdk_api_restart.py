"""The SDK riding out an API restart: the API process is SIGKILLed while SDK calls are in
flight or about to be made, the embedded supervisor starts it again, and the caller does
nothing about it.

    a sync `run` in flight      returns the job's text; its POST re-sent with the same
                                Idempotency-Key follows the one job it created
    a `submit` while it is down returns the job once the API is back; one job for the key
    `jobs.get` and `job.wait`   polls that meet the restart go on until the job ends
    a stream cut by the kill    ends with the job's whole text (the rest as one delta,
                                from the job polled to its end), no exception

Every call's job is the only one created for it (the checks read the database). The module
runs its own platform: the supervisor stops a platform whose API died six times in five
minutes, and the session's platform is left to the other scenarios' kills.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import Client
from tests.e2e.conftest import alive, embedded_platform
from tests.faults.harness import utcnow
from tests.faults.ledger import Ledger

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.timeout(300)]

DEPLOYMENT = "faults-sdk-api-restart"
# Jobs long enough (~1-2 s with the demo model) to be running when the API dies.
LONG = {"prompt": "Once upon a time", "max_tokens": 400}
RESTART_TIMEOUT_S = 60.0


class Api:
    """The platform's API process, as the supervisor runs it."""

    def __init__(self, platform: dict[str, Any]) -> None:
        self.state_dir: Path = platform["state_dir"]
        self.url: str = platform["url"]
        self.kills = 0

    def pid(self) -> int:
        """The supervisor's current pid of the API (platform.json is rewritten on restarts)."""
        return int(json.loads((self.state_dir / "platform.json").read_text())["children"]["api"])

    def kill(self) -> int:
        """SIGKILL it; returns the dead pid once its port refuses connections."""
        old = self.pid()
        os.kill(old, signal.SIGKILL)
        self.kills += 1
        deadline = time.monotonic() + 10
        while self.serving():
            assert time.monotonic() < deadline, "the killed API still answers"
            time.sleep(0.02)
        return old

    def restarted_since(self, old: int) -> bool:
        new = self.pid()
        return new != old and alive(new)

    def serving(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def api_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    # one API process: the scenario is the API's port going away and coming back
    env = {"PLATFORM_API_PROCESSES": "1"}
    with embedded_platform(tmp_path_factory.mktemp("sdk-api-restart"), env) as state:
        yield state


@pytest.fixture(scope="module")
def api(api_platform: dict[str, Any]) -> Api:
    return Api(api_platform)


@pytest.fixture(scope="module")
def ledger(api_platform: dict[str, Any]) -> Iterator[Ledger]:
    led = Ledger(api_platform["database_url"])
    yield led
    led.close()


@pytest.fixture(scope="module")
def client(api_platform: dict[str, Any], fault_model: Path) -> Iterator[Client]:
    """A client as a user makes it (default retries), on a deployment with a warm worker."""
    with Client(base_url=api_platform["url"], api_key=api_platform["api_key"], timeout=60) as c:
        c.deployments.create(name=DEPLOYMENT, model=str(fault_model), min_workers=1)
        c.run(DEPLOYMENT, {"prompt": "warm", "max_tokens": 1})
        yield c


def one_job_for(ledger: Ledger, since: datetime) -> tuple[str, str | None, str]:
    """The only job created since `since` (a re-sent POST without its key would make two)."""
    jobs = ledger.jobs_since(DEPLOYMENT, since)
    assert len(jobs) == 1, f"{len(jobs)} jobs for one call: {[j for j, _, _ in jobs]}"
    assert jobs[0][1], "the call carried no Idempotency-Key"
    return jobs[0]


def still_running(ledger: Ledger, since: datetime) -> bool:
    return [s for _, _, s in ledger.jobs_since(DEPLOYMENT, since)] == ["running"]


def wait_running(ledger: Ledger, since: datetime) -> None:
    deadline = time.monotonic() + 60
    while not any(s == "running" for _, _, s in ledger.jobs_since(DEPLOYMENT, since)):
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.02)


def test_a_sync_run_in_flight_returns_its_jobs_text(
    client: Client, api: Api, ledger: Ledger
) -> None:
    since = utcnow()
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["text"] = client.run(DEPLOYMENT, LONG)
        except BaseException as e:  # surfaced below, not lost in the thread
            result["error"] = e

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    wait_running(ledger, since)
    assert caller.is_alive(), "the run answered before the API could be killed"
    old = api.kill()
    assert still_running(ledger, since), "the job ended before the kill: nothing was in flight"
    caller.join(RESTART_TIMEOUT_S + 60)
    assert not caller.is_alive(), "the run never returned"
    assert "error" not in result, repr(result.get("error"))
    assert api.restarted_since(old)
    job_id, _, status = one_job_for(ledger, since)
    job = client.jobs.get(job_id)
    assert status == job.status == "succeeded"
    assert result["text"] == job.text and job.usage and job.usage["generated_tokens"] > 0


def test_a_submit_while_the_api_is_down_succeeds_once_it_is_back(
    client: Client, api: Api, ledger: Ledger
) -> None:
    since = utcnow()
    key = f"restart-{time.time_ns()}"
    old = api.kill()
    job = client.submit(DEPLOYMENT, LONG, idempotency_key=key)
    assert api.restarted_since(old)
    assert one_job_for(ledger, since)[:2] == (job.id, key)
    assert job.wait(timeout=120).status == "succeeded"


def test_get_and_wait_ride_out_a_restart(client: Client, api: Api, ledger: Ledger) -> None:
    since = utcnow()
    job = client.submit(DEPLOYMENT, LONG)
    wait_running(ledger, since)
    old = api.kill()
    # a read made while the API is down, then a wait whose polls meet the rest of the restart
    assert client.jobs.get(job.id).id == job.id
    assert job.wait(timeout=120).status == "succeeded"
    assert api.restarted_since(old)
    one_job_for(ledger, since)


def test_a_stream_cut_by_the_restart_ends_with_the_jobs_whole_text(
    client: Client, api: Api, ledger: Ledger
) -> None:
    since = utcnow()
    stream = client.run(DEPLOYMENT, LONG, stream=True)
    deltas = [next(iter(stream))]  # the job runs and streams
    old = api.kill()
    # its terminal event comes after the job ends in the database: the stream was cut short
    assert still_running(ledger, since), "the job ended before the kill: nothing was cut"
    deltas.extend(stream)  # the connection breaks: the job is polled to its end
    assert api.restarted_since(old)
    job_id, _, _ = one_job_for(ledger, since)
    assert stream.job is not None and stream.job.id == job_id == stream.job_id
    assert stream.job.status == "succeeded"
    assert "".join(deltas) == stream.job.text

"""A worker's life driven through the API for the billing tests: deploy and let the loop start a
worker, report its phases, claim and complete jobs as it would, and read the billing records."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from control_plane.reconcile.driver import Reconciler
from tests.integration.api_helpers import WORKER, deploy, h
from tests.integration.conftest import SteppedClock, provider


def report(
    client: TestClient, clock: SteppedClock, wid: str, state: str, at: float | None = None
) -> None:
    body = {"state": state, "at": clock().timestamp() if at is None else at}
    assert (
        client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER).status_code == 200
    )


def start_worker(
    client: TestClient, clock: SteppedClock, key: str, loop: Reconciler, **spec: Any
) -> str:
    """Deploy, queue a job so the loop starts a worker, and bring it to idle; returns its id."""
    deploy(client, key, **spec)
    submit(client, key)
    loop.tick(clock())
    wid = provider(loop).started[-1].worker_id
    for state in ("loading", "warming", "idle"):
        report(client, clock, wid, state)
    return wid  # the queued job stays for the caller to claim


def submit(client: TestClient, key: str, prompt: str = "x") -> str:
    r = client.post("/v1/deployments/demo/jobs", json={"input": {"prompt": prompt}}, headers=h(key))
    assert r.status_code == 202
    job_id: str = r.json()["id"]
    return job_id


def claim(client: TestClient, jid: str, wid: str) -> int:
    r = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
    assert r.status_code == 200, r.text
    attempt: int = r.json()["attempt"]
    return attempt


def complete(client: TestClient, jid: str, wid: str, attempt: int, prompt: int, gen: int) -> None:
    body = {
        "worker_id": wid,
        "attempt": attempt,
        "status": "succeeded",
        "output": {"text": "t", "finish_reason": "length"},
        "prompt_tokens": prompt,
        "generated_tokens": gen,
    }
    assert (
        client.post(f"/internal/jobs/{jid}/complete", json=body, headers=WORKER).status_code == 200
    )


def records(client: TestClient, key: str, **filters: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = client.get(
        "/v1/billing/records", params={"limit": 1000, **filters}, headers=h(key)
    ).json()["data"]
    return data

"""A sync call waits for its job's end alone (`events.wait_end`), against a real Redis."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from control_plane.services import events
from tests.integration.api_helpers import WORKER, deploy, h
from worker.protocol import JOB_EVENTS_ENDED_TTL_S, EventType, job_end_key, job_events_key


def test_every_waiter_of_a_sync_job_sees_its_end_and_only_its_end(
    redis_url: str, redis_client: Any
) -> None:
    job = {"id": "job_w", "status": "succeeded", "output": {"text": "x"}}

    async def scenario() -> list[Any]:
        r = aioredis.Redis.from_url(redis_url)
        try:
            # events before the end do not wake a waiter
            events.publish(redis_client, "job_w", EventType.RUNNING, {"attempt": 1})
            assert await events.wait_end(r, "job_w", block_s=0.1) is None
            waiters = [asyncio.create_task(events.wait_end(r, "job_w", block_s=5)) for _ in "ab"]
            await asyncio.sleep(0.05)
            events.publish_end(redis_client, "job_w", EventType.COMPLETED, job, waited_on=True)
            ends = await asyncio.gather(*waiters)
            late = await events.wait_end(r, "job_w", block_s=0.1)  # after the end: still there
            return [*ends, late]
        finally:
            await r.aclose()

    assert asyncio.run(scenario()) == [(EventType.COMPLETED, job)] * 3
    assert 0 < redis_client.ttl(job_end_key("job_w")) <= 60, "kept only for the moment after"
    # the stream has the terminal event as well, for streams and `follow`; an ended job's
    # stream is kept an hour, not the day an active one's is
    assert redis_client.xrevrange(job_events_key("job_w"), count=1)[0][1][b"type"] == b"completed"
    assert 60 < redis_client.ttl(job_events_key("job_w")) <= JOB_EVENTS_ENDED_TTL_S


def test_only_sync_jobs_get_an_end_to_wait_on(redis_client: Any) -> None:
    events.publish_end(redis_client, "job_a", EventType.COMPLETED, {"id": "job_a"}, waited_on=False)
    assert redis_client.exists(job_end_key("job_a")) == 0
    assert redis_client.exists(job_events_key("job_a")) == 1


def finish_when_queued(client: TestClient, key: str, text: str) -> threading.Thread:
    """A worker's part, on a thread: claim the tenant's first job once it exists, complete it."""

    def work() -> None:
        while not (data := client.get("/v1/jobs", headers=h(key)).json()["data"]):
            time.sleep(0.02)
        jid = data[0]["id"]
        c = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w1"}, headers=WORKER)
        report = {
            "worker_id": "w1",
            "attempt": c.json()["attempt"],
            "status": "succeeded",
            "output": {"text": text, "finish_reason": "stop"},
            "prompt_tokens": 1,
            "generated_tokens": 1,
        }
        assert client.post(f"/internal/jobs/{jid}/complete", json=report, headers=WORKER).is_success

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_a_sync_call_answers_with_its_job_as_it_ended(
    client: TestClient, keys: dict[str, str], redis_client: Any
) -> None:
    """Ended while the call waits: 200 with the job as it ended. Replayed after its end, when
    its end has left Redis: 200 with the job at once."""
    deploy(client, keys["a"])
    hdr = {**h(keys["a"]), "Idempotency-Key": "sync-1"}
    body = {"input": {"prompt": "hi"}, "wait_s": 30}
    worker = finish_when_queued(client, keys["a"], "yes")
    started = time.monotonic()
    first = client.post("/v1/deployments/demo/run", json=body, headers=hdr)
    worker.join()
    assert time.monotonic() - started < 10, "woken by the end, not by wait_s"
    assert first.status_code == 200 and first.json()["output"]["text"] == "yes"
    jid = first.json()["id"]
    redis_client.delete(job_end_key(jid))  # its end expired (JOB_END_TTL_S)
    started = time.monotonic()
    replay = client.post("/v1/deployments/demo/run", json=body, headers=hdr)
    assert time.monotonic() - started < 10, "an ended job is answered without waiting"
    assert replay.status_code == 200
    assert replay.json()["id"] == jid and replay.json()["output"]["text"] == "yes"

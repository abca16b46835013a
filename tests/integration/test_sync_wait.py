"""A sync call waits for its job's end alone (`events.wait_end`), against a real Redis, or has
it handed over in its own API process (`LocalEnds`)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from typing import Any

import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from common.protocol import JOB_EVENTS_ENDED_TTL_S, EventType, job_end_key, job_events_key
from control_plane.api.app import create_app
from control_plane.services.jobs import events
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER, deploy, h


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


def _unreachable_redis() -> aioredis.Redis:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens once closed
    return aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.2)


def test_a_call_waiting_in_the_process_that_ended_its_job_is_answered_from_there(
    client: TestClient, keys: dict[str, str]
) -> None:
    """The end is handed over in the process (`LocalEnds`), not read back from Redis: with
    every read of ends failing (a Redis the route cannot reach), the call still answers at
    its end, not at its `wait_s` (when it would read the job from the database)."""
    deploy(client, keys["a"])
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    client.app.state.ctx = dataclasses.replace(ctx, aredis=_unreachable_redis())  # type: ignore[attr-defined]
    try:
        worker = finish_when_queued(client, keys["a"], "from here")
        started = time.monotonic()
        body = {"input": {"prompt": "hi"}, "wait_s": 30}
        answer = client.post("/v1/deployments/demo/run", json=body, headers=h(keys["a"]))
        worker.join()
    finally:
        client.app.state.ctx = ctx  # type: ignore[attr-defined]
    assert time.monotonic() - started < 10, "answered at its end"
    assert answer.status_code == 200 and answer.json()["output"]["text"] == "from here"
    assert answer.json()["status"] == "succeeded"


def test_an_openai_call_waits_for_its_end_alone_and_leaves_a_late_job_running(
    settings: Settings, clock: Any, keys: dict[str, str]
) -> None:
    """`/v1/chat/completions` waits as `/run` does (`callers.end_of`): answered at its job's end;
    past the wait, 504 with the job, which runs on for the caller to poll (not canceled)."""
    short = settings.model_copy(update={"sync_wait_max_s": 0.5})
    with TestClient(create_app(short, clock=clock)) as client:
        deploy(client, keys["a"])
        chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
        late = client.post("/v1/chat/completions", json=chat, headers=h(keys["a"]))
        assert late.status_code == 504, late.text
        job_id = late.headers["X-Job-Id"]
        assert f"/v1/jobs/{job_id}" in late.json()["error"]["message"]  # OpenAI's error shape
        polled = client.get(f"/v1/jobs/{job_id}", headers=h(keys["a"])).json()
        assert polled["status"] == "queued", "left running for the caller to poll"
        client.delete(f"/v1/jobs/{job_id}", headers=h(keys["a"]))
    with TestClient(create_app(settings, clock=clock)) as client:
        deploy(client, keys["b"])  # a tenant of its own: its first job is this call's
        worker = finish_when_queued(client, keys["b"], "hello")
        answer = client.post("/v1/chat/completions", json=chat, headers=h(keys["b"]))
        worker.join()
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "hello"

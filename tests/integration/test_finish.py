"""Every path that ends a job goes through `services.jobs.finish`: each one, driven through the real
API and reconciler on real Redis and SQL, leaves the terminal status, exactly one terminal
event of the right type, `webhook_status`, and exactly one `job.completed` webhook message with
the one message-id scheme — also when the path is taken again (a retried report, a second
cancel, another tick).

The API and the reconciler share a clock the test moves (`conftest.SteppedClock`), so ttl,
execution limits and lost heartbeats are reached without sleeping.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from common.protocol import TERMINAL_EVENTS, job_cancel_key, job_events_key, worker_heartbeat_key
from control_plane.db.models import Job, JobAttempt
from control_plane.domain import endings, webhook_resend
from control_plane.reconcile.driver import Reconciler
from control_plane.services.jobs import finish
from control_plane.settings import Settings
from control_plane.tasks_api import CONTROL_QUEUE, DELIVER_WEBHOOK_TASK
from tests.integration.api_helpers import WORKER, deploy, h, submit
from tests.integration.conftest import SteppedClock, provider

HOOK = "http://127.0.0.1:9/hook"  # never delivered here: the test reads the queued messages


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"webhook_allow_private": True})


@dataclass
class World:
    client: TestClient
    loop: Reconciler
    clock: SteppedClock
    redis: redis.Redis
    key: str

    def submit(self, webhook: str | None = HOOK, **body: Any) -> str:
        if webhook:
            body["webhook"] = webhook
        return submit(self.client, self.key, **body)

    def tick(self, seconds: float = 0.0) -> None:
        self.loop.tick(self.clock.advance(seconds))

    def started_worker(self) -> str:
        """The newest worker the reconciler started, brought to idle (it served once)."""
        wid = provider(self.loop).started[-1].worker_id
        for state in ("loading", "warming", "idle"):
            body = {"state": state, "at": self.clock().timestamp()}
            r = self.client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER)
            assert r.status_code == 200
        return wid

    def claim(self, job_id: str, wid: str) -> int:
        r = self.client.post(
            f"/internal/jobs/{job_id}/claim", json={"worker_id": wid}, headers=WORKER
        )
        assert r.status_code == 200, r.text
        attempt: int = r.json()["attempt"]
        return attempt

    def report(self, job_id: str, wid: str, attempt: int, status: str) -> int:
        body: dict[str, Any] = {"worker_id": wid, "attempt": attempt, "status": status}
        if status == "succeeded":
            body.update(output={"text": "ok"}, prompt_tokens=1, generated_tokens=1)
        else:
            body["error"] = {"type": "model_error", "message": "boom"}
        r = self.client.post(f"/internal/jobs/{job_id}/complete", json=body, headers=WORKER)
        return r.status_code

    def job(self, job_id: str) -> Job:
        with self.loop.sessions() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job

    def terminal_events(self, job_id: str) -> list[str]:
        entries = self.redis.xrange(job_events_key(job_id))
        types = [fields[b"type"].decode() for _, fields in entries]
        return [t for t in types if t in TERMINAL_EVENTS]

    def completed_webhooks(self, job_id: str) -> list[str]:
        """Message ids of the queued `job.completed` deliveries of this job."""
        out = []
        for key in self.redis.scan_iter(match=CONTROL_QUEUE + "*"):
            for raw in self.redis.lrange(key, 0, -1):
                msg = json.loads(raw)
                if msg["headers"]["task"] != DELIVER_WEBHOOK_TASK:
                    continue
                _args, kwargs, _embed = json.loads(base64.b64decode(msg["body"]))
                if kwargs.get("job_id") == job_id and kwargs["event_type"] == "job.completed":
                    out.append(kwargs["msg_id"])
        return out


@pytest.fixture
def world(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    clock: SteppedClock,
    redis_client: Any,
) -> World:
    deploy(client, keys["a"])
    return World(client, loop, clock, redis_client, keys["a"])


def succeeded(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit()
    w.tick()
    wid = w.started_worker()
    attempt = w.claim(job_id, wid)
    assert w.report(job_id, wid, attempt, "succeeded") == 200
    # The worker retries its report when the answer is lost: refused by the fence.
    return job_id, lambda: w.report(job_id, wid, attempt, "succeeded") == 409 or pytest.fail()


def failed(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit()
    w.tick()
    wid = w.started_worker()
    attempt = w.claim(job_id, wid)
    assert w.report(job_id, wid, attempt, "failed") == 200
    return job_id, lambda: w.report(job_id, wid, attempt, "failed") == 409 or pytest.fail()


def canceled(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit()
    w.tick()
    w.claim(job_id, w.started_worker())

    def cancel() -> None:
        r = w.client.post(f"/v1/jobs/{job_id}/cancel", headers=h(w.key))
        assert r.status_code == 200 and r.json()["status"] == "canceled"

    cancel()
    assert w.redis.get(job_cancel_key(job_id)) == b"1", "its worker is told to stop"
    return job_id, cancel


def expired(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit(ttl_s=5)
    w.tick()
    w.tick(6)
    return job_id, lambda: w.tick(1)


def expired_at_claim(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit(ttl_s=5)
    w.tick()
    wid = w.started_worker()
    w.clock.advance(6)  # the worker claims after the ttl, before the reconciler looked

    def claim() -> None:
        r = w.client.post(f"/internal/jobs/{job_id}/claim", json={"worker_id": wid}, headers=WORKER)
        assert r.status_code == 409

    claim()
    return job_id, claim


def timed_out(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit(execution_timeout_s=1)
    w.tick()
    wid = w.started_worker()
    w.redis.set(worker_heartbeat_key(wid), json.dumps({"at": w.clock().timestamp()}), ex=60)
    w.claim(job_id, wid)
    w.tick(40)  # past the limit and the control plane's grace: the worker missed it
    assert w.redis.get(job_cancel_key(job_id)) == b"1", "its worker is told to stop"
    return job_id, lambda: w.tick(1)


def worker_lost_then_failed(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit()
    w.tick()
    for attempt in (1, 2, 3):
        assert w.claim(job_id, w.started_worker()) == attempt
        w.tick(60)  # no heartbeat: the worker is lost; the job is requeued, then fails
        if attempt < 3:
            assert w.job(job_id).status in ("queued", "starting")
            assert w.terminal_events(job_id) == []
    assert w.job(job_id).error["type"] == "worker_lost"  # type: ignore[index]
    return job_id, lambda: w.tick(60)


def crash_loop_then_failed(w: World) -> tuple[str, Callable[[], None]]:
    job_id = w.submit()
    w.tick()
    for _ in range(3):
        w.tick(60)  # the worker never booted nor heartbeat: failed before serving
    assert w.job(job_id).status_reason == "crash_loop"
    return job_id, lambda: w.tick(60)


PATHS = {
    "succeeded": (succeeded, "succeeded", "completed"),
    "failed": (failed, "failed", "failed"),
    "canceled": (canceled, "canceled", "canceled"),
    "expired": (expired, "expired", "expired"),
    "expired_at_claim": (expired_at_claim, "expired", "expired"),
    "timed_out": (timed_out, "timed_out", "timed_out"),
    "worker_lost_then_failed": (worker_lost_then_failed, "failed", "failed"),
    "crash_loop_then_failed": (crash_loop_then_failed, "failed", "failed"),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_terminal_path_ends_the_job_once(world: World, path: str) -> None:
    drive, status, event = PATHS[path]
    job_id, again = drive(world)
    job = world.job(job_id)
    assert job.status == status
    assert job.completed_at is not None
    assert world.terminal_events(job_id) == [event]
    assert job.webhook_status == "pending", "a job.completed message is on its way"
    assert world.completed_webhooks(job_id) == [f"msg_{job_id}_completed"]
    public = world.client.get(f"/v1/jobs/{job_id}", headers=h(world.key)).json()
    assert (public["status"], public["webhook_status"]) == (status, "pending")

    again()  # the same path once more changes nothing and announces nothing
    assert world.job(job_id).status == status
    assert world.terminal_events(job_id) == [event]
    # NOTE: no Celery worker records an attempt here, so a tick more than the resend grace
    # after the end finds the webhook lost and sends it once more (reconcile/webhooks.py):
    # the same message, under the same id.
    resent = world.clock() - job.completed_at > webhook_resend.GRACE
    assert world.completed_webhooks(job_id) == [f"msg_{job_id}_completed"] * (1 + resent)


def test_an_attempt_loaded_in_the_session_reads_as_its_end_wrote_it(world: World) -> None:
    """The attempt is closed by one UPDATE of the table: an attempt object the session already
    holds (the reconciler's billing reads them later in its tick) is reloaded, not left open."""
    job_id = world.submit(webhook=None)
    world.tick()
    attempt = world.claim(job_id, world.started_worker())
    ctx = world.client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.sessions() as session:
        held = session.scalars(
            select(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
        ).one()
        assert held.ended_at is None and held.outcome is None
        ended = finish.finish(
            session, ctx.outbox, [(job_id, endings.canceled("test"))], world.clock()
        )
        assert [j.id for j in ended] == [job_id]
        assert held.outcome == "canceled" and held.ended_at is not None


def test_without_a_completed_subscription_no_webhook_and_status_none(world: World) -> None:
    plain = world.submit(webhook=None)
    started_only = world.submit(webhook_events=["started"])
    world.tick()
    wid = world.started_worker()
    for job_id in (plain, started_only):
        attempt = world.claim(job_id, wid)
        assert world.report(job_id, wid, attempt, "succeeded") == 200
        assert world.job(job_id).webhook_status == "none"
        assert world.completed_webhooks(job_id) == []
        assert world.terminal_events(job_id) == ["completed"]


def test_a_batch_cancel_ends_its_jobs_through_the_same_path(world: World) -> None:
    r = world.client.post(
        "/v1/batches",
        json={"deployment": "demo", "inputs": [{"prompt": "a"}, {"prompt": "b"}]},
        headers=h(world.key),
    )
    batch = r.json()
    world.tick()
    with world.loop.sessions() as s:
        ids = [j.id for j in s.query(Job).filter(Job.batch_id == batch["id"]).order_by(Job.id)]
    world.claim(ids[0], world.started_worker())
    r = world.client.post(f"/v1/batches/{batch['id']}/cancel", headers=h(world.key))
    assert r.json()["counts"]["canceled"] == 2
    for job_id in ids:
        assert world.job(job_id).status_reason == "batch_canceled"
        assert world.terminal_events(job_id) == ["canceled"]
    assert world.redis.get(job_cancel_key(ids[0])) == b"1", "the running one is told to stop"

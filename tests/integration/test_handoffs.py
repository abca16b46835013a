"""Jobs handed to a worker at admission (services/jobs/handoff.py): claimed in the admission's
transaction, pushed to the worker's own list, popped by its consumer before its queue's
wake-ups; one its worker never receives is requeued by the reconciler."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.job_input import JobInput
from common.messages import Claim
from common.protocol import (
    HEARTBEAT_JOBS_FIELD,
    deployment_queue,
    job_events_key,
    queue_keys,
    worker_handoffs_key,
    worker_heartbeat_key,
)
from control_plane.db.models import Deployment, Job, JobAttempt, Worker
from control_plane.domain import fleet
from control_plane.domain.plans.jobs import HANDOFF_LOST
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.jobs import HANDOFF_GRACE_S
from control_plane.services.jobs.dispatch import dispatch_job
from tests.helpers import wait_for
from tests.integration.api_helpers import WORKER, deploy, h, submit
from tests.integration.conftest import SteppedClock
from tests.integration.test_metrics import scrape, total
from worker.runtime.consumer import Delivery, consume

HANDED_OFF = "platform_jobs_handed_off_total"


def _add_worker(loop: Reconciler, dep_id: str, now: datetime, **over: Any) -> str:
    """A serving worker row of `dep_id` (as the reconciler's start and the worker's reports
    leave it); `over`: columns to set otherwise."""
    worker_id = over.pop("id", "wrk_handoff")
    with loop.sessions() as s:
        dep = s.get(Deployment, dep_id)
        assert dep is not None
        s.add(
            Worker(
                id=worker_id,
                deployment_id=dep_id,
                deployment_version=over.pop("deployment_version", 1),
                tenant_id=dep.tenant_id,
                accelerator="cpu",
                state=over.pop("state", "idle"),
                state_since=now,
                started_at=now,
                takes_handoffs=over.pop("takes_handoffs", True),
                **over,
            )
        )
        s.commit()
    return worker_id


def _row(loop: Reconciler, job_id: str) -> Job:
    with loop.sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _events(redis_client: Any, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (fields[b"type"].decode(), json.loads(fields[b"data"]))
        for _, fields in redis_client.xrange(job_events_key(job_id))
    ]


def test_a_call_is_handed_to_a_worker_with_a_free_slot(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
) -> None:
    dep = deploy(client, keys["a"], target_concurrency=2)
    wid = _add_worker(loop, dep["id"], clock())
    before = scrape(client, keys["a"])
    r = client.post(
        "/v1/deployments/demo/jobs",
        json={"input": {"prompt": "to the worker", "max_tokens": 5}},
        headers=h(keys["a"]),
    )
    assert r.status_code == 202, r.text
    # committed as claimed: running on that worker, its first attempt, from its admission on
    body = r.json()
    assert (body["status"], body["attempt"]) == ("running", 1)
    assert body["started_at"] == body["created_at"]
    jid = body["id"]
    job = _row(loop, jid)
    assert (job.status, job.worker_id, job.attempt) == ("running", wid, 1)
    with loop.sessions() as s:
        attempts = s.query(JobAttempt).filter_by(job_id=jid).all()
        assert [(a.attempt, a.worker_id, a.ended_at) for a in attempts] == [(1, wid, None)]
        worker = s.get(Worker, wid)
        assert worker is not None and worker.state == "busy"  # the claim's own transaction
    # the claim's answer, pushed to that worker's list, and nothing to its queue
    (raw,) = redis_client.lrange(worker_handoffs_key(wid), 0, -1)
    handed = json.loads(raw)
    assert handed["job_id"] == jid and handed["attempt"] == 1 and handed["priority"] == 3
    assert handed["input"]["prompt"] == "to the worker" and handed["input"]["max_tokens"] == 5
    assert handed["execution_timeout_s"] > 0
    assert redis_client.ttl(worker_handoffs_key(wid)) > 0
    assert _wake_ups(redis_client, dep["id"]) == 0
    # announced as a claim is
    assert [(t, d.get("worker_id")) for t, d in _events(redis_client, jid)] == [
        ("queued", None),
        ("running", wid),
    ]
    # the worker reports it as it would a claimed one
    done = {"worker_id": wid, "attempt": 1, "status": "succeeded", "output": {"text": "ok"}}
    r = client.post(f"/internal/jobs/{jid}/complete", json=done, headers=WORKER)
    assert r.status_code == 200, r.text
    assert _row(loop, jid).status == "succeeded"

    # the next call finds the worker's slots free again (busy, but none of its jobs runs)
    second = submit(client, keys["a"])
    assert _row(loop, second).worker_id == wid
    counted = total(scrape(client, keys["a"]), HANDED_OFF, deployment="demo", kind="async")
    assert counted - total(before, HANDED_OFF, deployment="demo", kind="async") == 2


@pytest.mark.parametrize(
    "case", ["claims only", "told to stop", "older version", "every slot held", "a job waits"]
)
def test_a_call_waits_in_the_queue_when_no_worker_may_take_it(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
    case: str,
) -> None:
    dep = deploy(client, keys["a"], target_concurrency=1)
    before = total(scrape(client, keys["a"]), HANDED_OFF, deployment="demo")
    over: dict[str, Any] = {
        "claims only": {"takes_handoffs": False},
        "told to stop": {"reason": fleet.SCALE_DOWN},
        "older version": {"deployment_version": 0},
        "every slot held": {},
        "a job waits": {},
    }[case]
    if case == "a job waits":  # queued and sent, before any worker could take it
        first = submit(client, keys["a"])
    wid = _add_worker(loop, dep["id"], clock(), **over)
    if case == "every slot held":
        first = submit(client, keys["a"])
        assert _row(loop, first).worker_id == wid  # handed to it: its one slot
    jid = submit(client, keys["a"])
    job = _row(loop, jid)
    assert (job.status, job.worker_id, job.attempt) == ("queued", None, 0)
    waiting = 2 if case == "a job waits" else 1
    assert _wake_ups(redis_client, dep["id"]) == waiting  # a wake-up each
    handed = redis_client.lrange(worker_handoffs_key(wid), 0, -1)
    assert len(handed) == (1 if case == "every slot held" else 0)
    after = total(scrape(client, keys["a"]), HANDED_OFF, deployment="demo")
    assert after - before == len(handed)


def test_a_worker_says_it_takes_hand_offs_in_its_state_report(
    client: TestClient, keys: dict[str, str], loop: Reconciler, clock: SteppedClock
) -> None:
    dep = deploy(client, keys["a"])
    wid = _add_worker(loop, dep["id"], clock(), state="loading", takes_handoffs=False)
    path = f"/internal/workers/{wid}/state"
    at = clock().timestamp()
    r = client.post(path, json={"state": "idle", "at": at, "takes_handoffs": True}, headers=WORKER)
    assert r.status_code == 200, r.text
    r = client.post(path, json={"state": "busy", "at": at + 1}, headers=WORKER)
    assert r.status_code == 200, r.text
    with loop.sessions() as s:
        worker = s.get(Worker, wid)
        assert worker is not None and worker.takes_handoffs, "a later report keeps it"


def _beat(redis_client: Any, worker_id: str, at: float, jobs: list[str] | None) -> None:
    body: dict[str, Any] = {"worker_id": worker_id, "state": "busy", "at": at}
    if jobs is not None:
        body[HEARTBEAT_JOBS_FIELD] = jobs
    redis_client.set(worker_heartbeat_key(worker_id), json.dumps(body), ex=10)


@pytest.mark.parametrize("beats", ["without it", "with it", "without a list"])
def test_a_hand_off_its_worker_never_received_is_requeued(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    clock: SteppedClock,
    beats: str,
) -> None:
    """Its push lost (here: deleted), the worker's beats do not list the job: once a beat
    HANDOFF_GRACE_S newer than the first that missed it says so, the job is queued again as
    its next attempt, and a late report of the lost attempt no longer applies. A job the beats
    list, or beats that list nothing (a worker that claims only), are left alone."""
    dep = deploy(client, keys["a"], target_concurrency=2, scaledown_window_s=600)
    wid = _add_worker(loop, dep["id"], clock())
    jid = submit(client, keys["a"])
    assert _row(loop, jid).worker_id == wid
    redis_client.delete(worker_handoffs_key(wid))  # the push never arrived
    listed = {"without it": [], "with it": [jid], "without a list": None}[beats]
    t0 = clock().timestamp()
    for step in (0.0, HANDOFF_GRACE_S / 2, HANDOFF_GRACE_S - 0.5):
        _beat(redis_client, wid, t0 + step, listed)
        loop.tick(clock())
        assert _row(loop, jid).status == "running", f"requeued {step} s after the first miss"
    _beat(redis_client, wid, t0 + HANDOFF_GRACE_S, listed)
    loop.tick(clock())
    job = _row(loop, jid)
    if beats != "without it":
        assert (job.status, job.worker_id) == ("running", wid)
        return
    assert (job.status, job.status_reason, job.worker_id) == ("queued", HANDOFF_LOST, None)
    with loop.sessions() as s:
        (attempt,) = s.query(JobAttempt).filter_by(job_id=jid).all()
        assert (attempt.attempt, attempt.outcome) == (1, "worker_lost")  # unbilled
    assert _wake_ups(redis_client, dep["id"]) == 1, "its wake-up was sent"
    late = {"worker_id": wid, "attempt": 1, "status": "succeeded", "output": {"text": "late"}}
    assert client.post(f"/internal/jobs/{jid}/complete", json=late, headers=WORKER).status_code == (
        409
    )
    claimed = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
    assert claimed.status_code == 200 and claimed.json()["attempt"] == 2


# The worker's consumer: the hand-off list beside the queue (a real Redis).


def _handoff(redis_client: Any, worker_id: str, job_id: str, priority: int = 3) -> None:
    claim = Claim(job_id, 1, JobInput("x"), 60.0, "d", priority=priority)
    redis_client.lpush(worker_handoffs_key(worker_id), claim.to_json())


def test_hand_offs_are_taken_before_wake_ups(redis_url: str, redis_client: Any) -> None:
    queue = deployment_queue("dep_handoffs")
    dispatch_job(redis_client, "dep_handoffs", "job_woken", "sync")
    _handoff(redis_client, "wrk_c", "job_handed")
    _handoff(redis_client, "wrk_other", "job_not_mine")
    seen: list[Delivery] = []

    def handle(delivery: Delivery) -> None:
        seen.append(delivery)
        delivery.ack()

    handoffs = worker_handoffs_key("wrk_c")
    consume(redis_url, queue, 1, handle, lambda: len(seen) == 2, poll_s=0.1, handoffs=handoffs)
    assert [d.job_id for d in seen] == ["job_handed", "job_woken"]
    assert seen[0].claim is not None and seen[0].claim.input == JobInput("x")
    assert seen[0].priority == 3 and seen[1].claim is None
    assert redis_client.llen(worker_handoffs_key("wrk_other")) == 1


def test_a_hand_off_is_taken_with_every_slot_held_and_while_draining(
    redis_url: str, redis_client: Any
) -> None:
    """A job handed to the worker is its own already: taken while its one slot is held, and
    after it was asked to stop (where a wake-up goes back for another worker)."""
    queue = deployment_queue("dep_full_handoffs")
    handoffs = worker_handoffs_key("wrk_full")
    seen: list[Delivery] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=consume,
        args=(redis_url, queue, 1, seen.append, stop.is_set),
        kwargs={"poll_s": 0.05, "handoffs": handoffs},
    )
    dispatch_job(redis_client, "dep_full_handoffs", "job_holding", "async")
    thread.start()
    try:
        wait_for(lambda: [d.job_id for d in seen] == ["job_holding"])
        _handoff(redis_client, "wrk_full", "job_while_full")
        wait_for(lambda: len(seen) == 2)
        stop.set()
        time.sleep(0.2)
        dispatch_job(redis_client, "dep_full_handoffs", "job_for_another", "async")
        _handoff(redis_client, "wrk_full", "job_while_draining")
        wait_for(lambda: len(seen) == 3)
        assert [d.job_id for d in seen] == ["job_holding", "job_while_full", "job_while_draining"]
        for d in seen:
            d.ack()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the consumer did not drain and return"
        assert sum(redis_client.llen(k) for k in queue_keys(queue)) == 1, "left for another"
    finally:
        stop.set()
        for d in seen:
            d.ack()
        thread.join(timeout=20)


def _wake_ups(redis_client: Any, dep_id: str) -> int:
    """Wake-ups waiting in the deployment's queue (every priority's list)."""
    return sum(redis_client.llen(k) for k in queue_keys(deployment_queue(dep_id)))

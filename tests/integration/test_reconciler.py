"""The reconciler's duties against real Redis and SQL, with an injected
clock. The provider records starts/stops instead of spawning processes (the e2e tests run
real workers)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from common.protocol import deployment_queue, worker_heartbeat_key
from control_plane.db.models import Deployment, Job, Worker
from control_plane.reconcile import workers
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.jobs import ORPHAN_GRACE_S
from control_plane.services.jobs.dispatch import UNACKED_INDEX_KEY, UNACKED_KEY, queue_depth
from tests.integration.api_helpers import WORKER, deploy, h
from tests.integration.conftest import provider


def now() -> datetime:
    return datetime.now(UTC)


def job_row(loop: Reconciler, job_id: str) -> Job:
    with loop.sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def job_and_heartbeating_worker(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> tuple[str, str]:
    """A job submitted at zero workers, and the worker the reconciler started for it, whose
    heartbeat is fresh for 10 s."""
    deploy(client, keys["a"])
    jid = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    ).json()["id"]
    loop.tick(now())
    wid = provider(loop).started[0].worker_id
    redis_client.set(worker_heartbeat_key(wid), "{}", ex=10)
    return jid, wid


def test_scale_from_zero_marks_jobs_starting(
    client: TestClient, keys: dict[str, str], loop: Reconciler
) -> None:
    deploy(client, keys["a"])
    jid = client.post(
        "/v1/deployments/demo/jobs", json={"input": {"prompt": "x"}}, headers=h(keys["a"])
    ).json()["id"]
    loop.tick(now())
    assert len(provider(loop).started) == 1
    job = client.get(f"/v1/jobs/{jid}", headers=h(keys["a"])).json()
    assert (job["status"], job["status_reason"]) == ("starting", "no_capacity")
    assert job["queue_position"] == 0
    loop.tick(now())
    assert len(provider(loop).started) == 1, "a booting worker counts: no second start"


def test_ttl_expires_jobs_that_never_started(
    client: TestClient, keys: dict[str, str], loop: Reconciler
) -> None:
    deploy(client, keys["a"], max_workers=1)
    jid = client.post(
        "/v1/deployments/demo/jobs",
        json={"input": {"prompt": "x"}, "ttl_s": 5},
        headers=h(keys["a"]),
    ).json()["id"]
    loop.tick(now())
    assert job_row(loop, jid).status == "starting"
    loop.tick(now() + timedelta(seconds=6))
    job = client.get(f"/v1/jobs/{jid}", headers=h(keys["a"])).json()
    assert (job["status"], job["status_reason"]) == ("expired", "ttl_passed")
    assert (
        client.post(
            f"/internal/jobs/{jid}/claim", json={"worker_id": "w"}, headers=WORKER
        ).status_code
        == 409
    )


def report_states(client: TestClient, wid: str, states: list[str], at: float) -> None:
    """The worker reports these states in turn, a tenth of a second apart from `at`."""
    for i, state in enumerate(states):
        r = client.post(
            f"/internal/workers/{wid}/state",
            json={"state": state, "at": at + i * 0.1},
            headers=WORKER,
        )
        assert r.status_code == 200


def job_running_on_worker(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> tuple[str, str]:
    """`job_and_heartbeating_worker`, the worker serving and the job claimed by it (attempt 1)."""
    jid, wid = job_and_heartbeating_worker(client, keys, loop, redis_client)
    report_states(client, wid, ["loading", "warming", "idle", "busy"], now().timestamp())
    claim = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
    assert claim.json()["attempt"] == 1
    return jid, wid


def assert_requeued_as_lost(client: TestClient, loop: Reconciler, jid: str, wid: str) -> None:
    """The job waits again (worker_lost), woken; its lost attempt can no longer report, and the
    next claim is attempt 2."""
    job = job_row(loop, jid)
    assert job.status in ("queued", "starting") and job.status_reason in (
        "worker_lost",
        "no_capacity",
    )
    assert queue_depth(loop.env.celery, deployment_queue(job.deployment_id)) >= 1
    stale = {"worker_id": wid, "attempt": 1, "status": "succeeded", "output": {"text": "x"}}
    assert (
        client.post(f"/internal/jobs/{jid}/complete", json=stale, headers=WORKER).status_code == 409
    )
    again = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w2"}, headers=WORKER)
    assert again.json()["attempt"] == 2


def test_lost_heartbeat_fails_the_worker_and_requeues_its_job(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> None:
    jid, wid = job_running_on_worker(client, keys, loop, redis_client)
    loop.tick(now() + timedelta(seconds=5))
    assert provider(loop).killed == [], "a heartbeating worker is left alone"
    redis_client.delete(worker_heartbeat_key(wid))
    loop.tick(now() + timedelta(seconds=60))
    assert provider(loop).killed == [wid]
    with loop.sessions() as s:
        w = s.get(Worker, wid)
        assert w is not None and (w.state, w.reason) == ("failed", "heartbeat_lost")
    assert_requeued_as_lost(client, loop, jid, wid)


def test_a_job_of_a_worker_failed_by_a_tick_that_ended_before_requeueing_is_requeued_later(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> None:
    """A replica killed or deposed between a tick's transactions (a failover) leaves the worker
    failed and its job running: the next tick, of any replica, takes the job back."""
    jid, wid = job_running_on_worker(client, keys, loop, redis_client)
    redis_client.delete(worker_heartbeat_key(wid))
    lost_at = now() + timedelta(seconds=60)
    with loop.sessions() as session:  # the tick's first step alone, committed
        assert workers.check_liveness(session, loop.env, lost_at) == [wid]
    assert job_row(loop, jid).status == "running"
    # (its life ended at its last heartbeat, longer ago than the grace for its last reports)
    loop.tick(lost_at + timedelta(seconds=2))
    assert_requeued_as_lost(client, loop, jid, wid)


def test_the_late_claim_of_a_worker_that_was_failed_is_refused(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> None:
    """A worker the reconciler failed (and killed) whose last claim arrives after that holds
    no job: the job waits for another worker, its attempts untouched."""
    jid, wid = job_and_heartbeating_worker(client, keys, loop, redis_client)
    report_states(client, wid, ["loading", "warming", "idle"], now().timestamp())
    redis_client.delete(worker_heartbeat_key(wid))
    loop.tick(now() + timedelta(seconds=60))
    assert provider(loop).killed == [wid]
    claim = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
    assert claim.status_code == 409
    many = client.post(
        "/internal/jobs/claim", json={"worker_id": wid, "job_ids": [jid]}, headers=WORKER
    )
    assert many.json()["claims"] == [{"job_id": jid, "claimed": False}]
    job = job_row(loop, jid)
    assert (job.status, job.attempt, job.worker_id) == ("starting", 0, None)
    with loop.sessions() as session:
        worker = session.get(Worker, wid)
        assert worker is not None and worker.state == "failed", "not made busy again"
    again = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w2"}, headers=WORKER)
    assert again.json()["attempt"] == 1


def test_a_job_a_stopped_worker_never_reported_is_requeued_after_the_grace(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> None:
    """A worker whose drain ended at its limit with a job still running reports `stopped`, and
    then nothing more: its process is not this replica's to reap (started by another)."""
    jid, wid = job_running_on_worker(client, keys, loop, redis_client)
    stopped_at = now().timestamp() + 1
    report_states(client, wid, ["draining", "stopped"], stopped_at)
    loop.tick(datetime.fromtimestamp(stopped_at + 1, UTC))
    assert job_row(loop, jid).status == "running", "its report may still be on its way"
    loop.tick(datetime.fromtimestamp(stopped_at + ORPHAN_GRACE_S + 1, UTC))
    assert_requeued_as_lost(client, loop, jid, wid)


def test_a_report_that_lands_within_the_grace_after_its_worker_stopped_counts(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> None:
    jid, wid = job_running_on_worker(client, keys, loop, redis_client)
    stopped_at = now().timestamp() + 1
    report_states(client, wid, ["draining", "stopped"], stopped_at)
    loop.tick(datetime.fromtimestamp(stopped_at + 1, UTC))
    done = {"worker_id": wid, "attempt": 1, "status": "succeeded", "output": {"text": "x"}}
    r = client.post(f"/internal/jobs/{jid}/complete", json=done, headers=WORKER)
    assert r.status_code == 200
    loop.tick(datetime.fromtimestamp(stopped_at + ORPHAN_GRACE_S + 1, UTC))
    assert job_row(loop, jid).status == "succeeded"


# A worker's broker side, in its own process so that it can die holding a delivery unacked.
TAKE_ONE = """
import sys, time
from kombu import Connection, Exchange, Queue
from common.protocol import BROKER_TRANSPORT_OPTIONS
url, name = sys.argv[1], sys.argv[2]
queue = Queue(name, Exchange(name, "direct"), routing_key=name)
with Connection(url, transport_options=BROKER_TRANSPORT_OPTIONS) as conn:
    with conn.Consumer([queue], callbacks=[lambda b, m: print("got", flush=True)],
                       prefetch_count=1, accept=["json"]):
        conn.drain_events(timeout=20)
        time.sleep(120)
"""


def test_a_killed_workers_unacked_wake_up_is_forgotten_once_nothing_needs_it(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> None:
    jid, wid = job_and_heartbeating_worker(client, keys, loop, redis_client)
    queue = deployment_queue(job_row(loop, jid).deployment_id)
    taker = subprocess.Popen(
        [sys.executable, "-c", TAKE_ONE, loop.env.settings.redis_url, queue],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert taker.stdout is not None and taker.stdout.readline().strip() == "got"
        claim = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
        assert claim.status_code == 200
    finally:
        taker.kill()  # SIGKILL: the delivery is never acked
        taker.wait(timeout=10)
    assert redis_client.hlen(UNACKED_KEY) == 1
    loop.tick(now() + timedelta(seconds=20))
    assert redis_client.hlen(UNACKED_KEY) == 1, "its job runs (heartbeat fresh): still needed"
    redis_client.delete(worker_heartbeat_key(wid))
    loop.tick(now() + timedelta(seconds=60))  # the worker is dead, its job requeued
    assert job_row(loop, jid).status in ("queued", "starting")
    assert redis_client.hlen(UNACKED_KEY) == 0 and redis_client.zcard(UNACKED_INDEX_KEY) == 0
    assert queue_depth(loop.env.celery, queue) >= 1, "the job's fresh wake-up waits in its queue"


def test_new_version_drains_old_workers(
    client: TestClient, keys: dict[str, str], loop: Reconciler, redis_client: Any
) -> None:
    deploy(client, keys["a"], min_workers=1)
    loop.tick(now())
    old = provider(loop).started[0]
    assert old.assignment is not None and old.assignment.deployment_version == 1
    redis_client.set(worker_heartbeat_key(old.worker_id), "{}", ex=10)
    r = client.put(
        "/v1/deployments/demo",
        json={"name": "demo", "model": "store://models/demo-v2/", "min_workers": 1},
        headers=h(keys["a"]),
    )
    assert r.json()["version"] == 2
    loop.tick(now())
    assert provider(loop).stopped == [old.worker_id]
    new = provider(loop).started[-1]
    with loop.sessions() as s:
        dep = s.get(Deployment, r.json()["id"])
        assert dep is not None
        tenant = dep.tenant_id
    # The worker reads the tenant's namespace in the platform's bucket, nothing else.
    physical = f"s3://{loop.env.settings.store_bucket}/tenants/{tenant}/models/demo-v2/"
    assert new.assignment is not None
    assert (new.assignment.deployment_version, new.assignment.model_uri) == (2, physical)


def test_execution_overrun_is_timed_out_by_the_control_plane(
    client: TestClient, keys: dict[str, str], loop: Reconciler
) -> None:
    deploy(client, keys["a"])
    jid = client.post(
        "/v1/deployments/demo/jobs",
        json={"input": {"prompt": "x"}, "execution_timeout_s": 1},
        headers=h(keys["a"]),
    ).json()["id"]
    claim = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w"}, headers=WORKER)
    assert claim.json()["execution_timeout_s"] == 1
    loop.tick(now() + timedelta(seconds=120))
    job = client.get(f"/v1/jobs/{jid}", headers=h(keys["a"])).json()
    assert job["status"] == "timed_out" and job["error"]["type"] == "timed_out"

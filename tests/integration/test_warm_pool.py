"""The warm pool in the reconciler (real Redis and SQL, an injected clock, a provider that
records starts): the pool boots ahead, a cold start takes its worker instead of booting (the
job hears `assigning_warm_worker`, then the weight bytes), the platform pays for pool seconds,
a pool worker is assigned once, and one that dies after its assignment is replaced."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from common.messages import Assignment
from common.protocol import HEARTBEAT_HOST_TIER_FIELD, worker_assignment_key, worker_heartbeat_key
from control_plane.db.models import BillingRecord, Deployment, Worker
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.providers.base import Exited, WorkerSpec
from control_plane.reconcile.driver import Reconciler
from control_plane.services.storage import storage_access
from control_plane.services.workers import worker_records
from control_plane.settings import Settings
from tests.integration.api_helpers import beat, deploy, h, past, report, starting_events, submit
from tests.integration.conftest import provider


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # a platform with vLLM too: its deployments never take a pool worker
    return settings.model_copy(update={"warm_pool_max": 1, "vllm_python": "/opt/vllm/python"})


@dataclass(frozen=True)
class Pooled:
    worker_id: str  # the idle pool worker
    t0: datetime  # when the pool booted it


@pytest.fixture
def pooled(client: TestClient, keys: dict[str, str], loop: Reconciler) -> Pooled:
    """Tenant A's `demo` deployment (at most one worker) and an idle pool worker."""
    deploy(client, keys["a"], max_workers=1)
    t0 = past()
    return Pooled(pool_ready(client, loop, t0), t0)


def call_at_zero(client: TestClient, key: str, loop: Reconciler, pooled: Pooled) -> str:
    """A job on `demo`, then a tick (3 s after the pool booted); the job's id."""
    jid = submit(client, key)
    loop.tick(pooled.t0 + timedelta(seconds=3))
    return jid


def pool_ready(client: TestClient, loop: Reconciler, t0: datetime) -> str:
    """Tick at t0: the pool boots its worker, which reports idle 2 s later; its id."""
    loop.tick(t0)
    (spec,) = provider(loop).started
    assert spec.assignment is None  # a generic worker: no deployment, no model, no credentials
    report(client, spec.worker_id, "idle", t0 + timedelta(seconds=2))
    return spec.worker_id


def popped_assignment(redis_client: Any, worker_id: str) -> Assignment:
    raw = redis_client.lpop(worker_assignment_key(worker_id))
    assert raw is not None, "no assignment sent"
    return Assignment.from_json(raw)


def rows(settings: Settings, model: Any, *where: Any) -> list[Any]:
    with make_sessionmaker(make_engine(settings.database_url))() as s:
        return list(s.scalars(select(model).where(*where)))


def test_a_cold_start_takes_the_pool_worker_and_reports_its_assignment_then_the_bytes(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    settings: Settings,
    pooled: Pooled,
) -> None:
    pool_id, t0 = pooled.worker_id, pooled.t0
    jid = call_at_zero(client, keys["a"], loop, pooled)

    # no new process: the pool worker got the deployment
    assert len(provider(loop).started) == 1
    got = popped_assignment(redis_client, pool_id)
    (dep,) = rows(settings, Deployment, Deployment.name == "demo")
    assert (got.deployment_id, got.deployment_version, got.max_concurrency) == (dep.id, 1, 1)
    assert got.queue.endswith(dep.id)
    (w,) = rows(settings, Worker, Worker.id == pool_id)
    assert (w.deployment_id, w.tenant_id, w.state) == (dep.id, dep.tenant_id, "loading")
    assert w.assigned_at == w.started_at
    job = client.get(f"/v1/jobs/{jid}", headers=h(keys["a"])).json()
    assert (job["status"], job["status_reason"]) == ("starting", "assigning_warm_worker")
    scaling = client.get("/v1/deployments/demo", headers=h(keys["a"])).json()["scaling"]
    assert scaling["placement"]["choice"] == "pool"
    assert scaling["placement"]["worker_id"] == pool_id
    assert set(scaling["placement"]["options"]) == {"pool", "boot"}

    # the weights land
    for i, done in enumerate((250, 750)):
        beat(redis_client, pool_id, done, 1000)
        loop.tick(t0 + timedelta(seconds=4 + i))
    phases = [(e["phase"], e["bytes_done"]) for e in starting_events(redis_client, jid)]
    assert phases == [
        ("assigning_warm_worker", None),
        ("loading_weights", 250),
        ("loading_weights", 750),
    ]
    # while its load runs, the pool is not refilled (a boot would take the load's cores)
    assert len(provider(loop).started) == 1

    # ready: the job can run, and the pool boots a replacement
    report(client, pool_id, "warming", t0 + timedelta(seconds=6))
    report(client, pool_id, "idle", t0 + timedelta(seconds=7))
    loop.tick(t0 + timedelta(seconds=8))
    assert [s.assignment for s in provider(loop).started[1:]] == [None]

    # the platform paid for the pool's boot and wait; the tenant from the assignment on
    records = rows(settings, BillingRecord, BillingRecord.worker_id == pool_id)
    billed: dict[tuple[str, str, str | None], Decimal] = {}
    for r in records:  # the pool's time: its boot and its wait, both the platform's
        key = (r.phase, r.tenant_id, r.deployment_id)
        billed[key] = billed.get(key, Decimal(0)) + r.seconds
    assert billed == {
        ("pool", worker_records.PLATFORM_TENANT_ID, None): Decimal("3.000"),
        ("load", dep.tenant_id, dep.id): Decimal("3.000"),
        ("warm", dep.tenant_id, dep.id): Decimal("1.000"),
    }


def test_a_pool_worker_whose_host_holds_the_model_is_placed_by_host_tier(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    settings: Settings,
    pooled: Pooled,
) -> None:
    pool_id = pooled.worker_id
    (dep,) = rows(settings, Deployment, Deployment.name == "demo")
    with make_sessionmaker(make_engine(settings.database_url))() as s:
        uri = storage_access.resolve(s, settings, dep.tenant_id, dep.spec.model).uri
    tier = [uri.rstrip("/") + "/model.safetensors"]
    redis_client.set(
        worker_heartbeat_key(pool_id),
        json.dumps({"worker_id": pool_id, "state": "idle", HEARTBEAT_HOST_TIER_FIELD: tier}),
        ex=10,
    )
    call_at_zero(client, keys["a"], loop, pooled)
    placement = client.get("/v1/deployments/demo", headers=h(keys["a"])).json()["scaling"][
        "placement"
    ]
    assert (placement["choice"], placement["worker_id"]) == ("pool_host_tier", pool_id)
    assert placement["eta_s"] < placement["options"]["pool"] < placement["options"]["boot"]
    assert popped_assignment(redis_client, pool_id).model_uri == uri


def test_a_pool_worker_is_assigned_once(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    settings: Settings,
) -> None:
    deploy(client, keys["a"], max_workers=1)
    deploy(client, keys["b"], max_workers=1)
    t0 = past()
    pool_id = pool_ready(client, loop, t0)
    submit(client, keys["a"])
    submit(client, keys["b"])
    loop.tick(t0 + timedelta(seconds=3))
    # one deployment got the pool worker, the other a new boot
    (_, booted) = provider(loop).started
    assert booted.assignment is not None
    got = popped_assignment(redis_client, pool_id)
    assert {got.deployment_id, booted.assignment.deployment_id} == {
        d.id for d in rows(settings, Deployment, Deployment.name == "demo")
    }
    assert redis_client.llen(worker_assignment_key(pool_id)) == 0
    # and it is never assigned again, whoever asks
    (other,) = rows(settings, Deployment, Deployment.id == booted.assignment.deployment_id)
    with make_sessionmaker(make_engine(settings.database_url))() as s:
        w = s.get(Worker, pool_id)
        assert w is not None
        assert not worker_records.assign(s, settings, w, other, "test", t0 + timedelta(seconds=4))
        s.commit()
    (w,) = rows(settings, Worker, Worker.id == pool_id)
    assert w.deployment_id == got.deployment_id


def test_a_deployment_on_vllm_boots_its_own_worker_beside_an_idle_pool_worker(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    settings: Settings,
) -> None:
    deploy(client, keys["b"], max_workers=1)  # on the built-in engine: the pool is for it
    deploy(client, keys["a"], max_workers=1, engine="vllm", accelerator_count=2)
    t0 = past()
    pool_id = pool_ready(client, loop, t0)
    submit(client, keys["a"])
    loop.tick(t0 + timedelta(seconds=3))
    (_, booted) = provider(loop).started
    assert booted.assignment is not None and booted.worker_id != pool_id
    (dep,) = rows(settings, Deployment, Deployment.id == booted.assignment.deployment_id)
    assert dep.engine_resolved == "vllm"  # tenant a's (b's is on the built-in engine)
    # the worker is told its engine and accelerators (its provider picks its environment)
    assert (booted.assignment.engine, booted.assignment.accelerator_count) == ("vllm", 2)
    assert redis_client.llen(worker_assignment_key(pool_id)) == 0
    (w,) = rows(settings, Worker, Worker.id == pool_id)
    assert (w.deployment_id, w.state) == (None, "idle")


def test_a_pool_worker_that_dies_after_its_assignment_is_replaced_and_the_job_waits(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    settings: Settings,
    pooled: Pooled,
) -> None:
    pool_id, t0 = pooled.worker_id, pooled.t0
    jid = call_at_zero(client, keys["a"], loop, pooled)
    popped_assignment(redis_client, pool_id)
    provider(loop).exits.append(Exited(pool_id, -9))
    loop.tick(t0 + timedelta(seconds=4))
    (w,) = rows(settings, Worker, Worker.id == pool_id)
    assert (w.state, w.reason) == ("failed", "exit_-9")
    # it died loading this deployment's model: like any worker's, its death backs off the
    # next start (1 s), and the job waits on
    job = client.get(f"/v1/jobs/{jid}", headers=h(keys["a"])).json()
    assert (job["status"], job["status_reason"]) == ("starting", "crash_loop")
    loop.tick(t0 + timedelta(seconds=5.5))
    # a fresh worker (the pool is empty: a boot) takes over the job
    job = client.get(f"/v1/jobs/{jid}", headers=h(keys["a"])).json()
    assert (job["status"], job["status_reason"]) == ("starting", "no_capacity")
    replacement: WorkerSpec = provider(loop).started[-1]
    assert replacement.worker_id != pool_id and replacement.assignment is not None
    assert [e.get("phase") for e in starting_events(redis_client, jid)] == [
        "assigning_warm_worker",
        None,  # {"reason": "crash_loop"}
        "booting",
    ]


def test_no_pool_without_a_budget_and_a_pool_that_is_no_longer_wanted_drains(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    settings: Settings,
) -> None:
    t0 = past()
    loop.tick(t0)
    assert provider(loop).started == []  # no deployment: no pool
    deploy(client, keys["a"], max_workers=1)
    pool_id = pool_ready(client, loop, t0 + timedelta(seconds=1))
    client.delete("/v1/deployments/demo", headers=h(keys["a"]))
    loop.tick(t0 + timedelta(seconds=4))
    assert provider(loop).stopped == [pool_id]
    (w,) = rows(settings, Worker, Worker.id == pool_id)
    assert w.reason == "pool_shrink"

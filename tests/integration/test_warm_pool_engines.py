"""The warm pool per engine in the reconciler (real Redis and SQL, an injected clock, a
provider that records starts): on a platform with vLLM the pool keeps a vLLM pool worker for
vLLM's deployments beside the built-in one; a cold start takes a pool worker of its own engine
and never the other's (it boots its own instead); a platform without vLLM keeps none."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.protocol import worker_assignment_key
from control_plane.db.models import Deployment, Worker
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.providers.base import WorkerSpec
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.pool import FreePool
from control_plane.services.workers import worker_records
from control_plane.settings import Settings
from tests.integration.api_helpers import deploy, h, past, report, submit
from tests.integration.conftest import provider
from tests.integration.test_warm_pool import popped_assignment, rows


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # a platform with vLLM (its python: the provider records starts, none runs) and room for
    # a pool worker of each engine
    return settings.model_copy(update={"warm_pool_max": 2, "vllm_python": "/opt/vllm/python"})


def both_engines(client: TestClient, keys: dict[str, str], settings: Settings) -> dict[str, str]:
    """Tenant A's `demo` on vLLM (one accelerator), tenant B's `demo` on the built-in engine;
    engine → deployment id."""
    deploy(client, keys["a"], max_workers=1, engine="vllm")
    deploy(client, keys["b"], max_workers=1)
    return {d.engine_resolved: d.id for d in rows(settings, Deployment)}


def pool_boots(loop: Reconciler) -> dict[str, WorkerSpec]:
    """The pool workers started so far, by the engine they were told to prepare."""
    pool = [s for s in provider(loop).started if s.assignment is None]
    by_engine = {s.pool_engine: s for s in pool}
    assert len(by_engine) == len(pool), "one pool worker per engine here"
    return by_engine


def test_each_engines_deployment_takes_a_pool_worker_of_its_own_engine(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    settings: Settings,
) -> None:
    deps = both_engines(client, keys, settings)
    t0 = past()
    loop.tick(t0)
    pool = pool_boots(loop)
    assert set(pool) == {"builtin", "vllm"}
    assert all(s.engine == e for e, s in pool.items())  # the provider's choice of environment
    for w in rows(settings, Worker):
        assert w.engine == ("vllm" if w.id == pool["vllm"].worker_id else "builtin")
    for spec in pool.values():
        report(client, spec.worker_id, "idle", t0 + timedelta(seconds=2))

    # the operator sees the pool per engine
    view = client.get("/v1/pool", headers=h(keys["a"])).json()
    assert {(w["id"], w["engine"]) for w in view["data"]} == {
        (s.worker_id, e) for e, s in pool.items()
    }
    assert view["counts_by_engine"] == {
        "builtin": {"cpu": {"idle": 1}},
        "vllm": {"cpu": {"idle": 1}},
    }

    # a call on the vLLM deployment: the vLLM pool worker gets it, nothing boots
    submit(client, keys["a"])
    loop.tick(t0 + timedelta(seconds=3))
    assert len(provider(loop).started) == 2
    got = popped_assignment(redis_client, pool["vllm"].worker_id)
    assert (got.deployment_id, got.engine, got.accelerator_count) == (deps["vllm"], "vllm", 1)
    # and one on the built-in deployment: the built-in pool worker
    submit(client, keys["b"])
    loop.tick(t0 + timedelta(seconds=4))
    assert len(provider(loop).started) == 2
    got = popped_assignment(redis_client, pool["builtin"].worker_id)
    assert (got.deployment_id, got.engine) == (deps["builtin"], "builtin")

    # the tenant's worker list says which engine runs its worker
    (w,) = client.get("/v1/workers", headers=h(keys["a"])).json()["data"]
    assert (w["id"], w["engine"]) == (pool["vllm"].worker_id, "vllm")


@pytest.mark.parametrize("idle_engine", ["builtin", "vllm"])
def test_a_cold_start_never_takes_another_engines_pool_worker(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    redis_client: Any,
    settings: Settings,
    idle_engine: str,
) -> None:
    """Only the other engine's pool worker is idle (its own still boots): the deployment boots
    its own worker, and the idle one stays in the pool, unassigned."""
    deps = both_engines(client, keys, settings)
    t0 = past()
    loop.tick(t0)
    pool = pool_boots(loop)
    idle = pool[idle_engine]
    report(client, idle.worker_id, "idle", t0 + timedelta(seconds=2))
    other = "vllm" if idle_engine == "builtin" else "builtin"
    submit(client, keys["a" if other == "vllm" else "b"])
    loop.tick(t0 + timedelta(seconds=3))
    booted = provider(loop).started[-1]
    assert booted.assignment is not None and booted.worker_id not in {
        s.worker_id for s in pool.values()
    }
    assert (booted.assignment.deployment_id, booted.engine) == (deps[other], other)
    assert redis_client.llen(worker_assignment_key(idle.worker_id)) == 0
    (w,) = rows(settings, Worker, Worker.id == idle.worker_id)
    assert (w.deployment_id, w.state, w.engine) == (None, "idle", idle_engine)

    # whatever would assign it (the plans never do), its row refuses the other engine
    (dep,) = rows(settings, Deployment, Deployment.id == deps[other])
    with make_sessionmaker(make_engine(settings.database_url))() as s:
        row = s.get(Worker, idle.worker_id)
        assert row is not None
        assert not worker_records.assign(s, settings, row, dep, "test", t0 + timedelta(seconds=4))
        s.commit()
    (w,) = rows(settings, Worker, Worker.id == idle.worker_id)
    assert (w.deployment_id, w.state) == (None, "idle")


def test_without_vllm_the_platform_keeps_no_vllm_pool_and_drains_the_one_it_had(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    settings: Settings,
) -> None:
    both_engines(client, keys, settings)
    t0 = past()
    loop.tick(t0)
    pool = pool_boots(loop)
    for spec in pool.values():
        report(client, spec.worker_id, "idle", t0 + timedelta(seconds=2))
    # the platform loses vLLM (PLATFORM_VLLM_PYTHON unset): its vLLM deployments stay, but no
    # pool worker is kept for them
    without = settings.model_copy(update={"vllm_python": ""})
    loop.env = dataclasses.replace(loop.env, settings=without)
    loop.tick(t0 + timedelta(seconds=3))
    assert provider(loop).stopped == [pool["vllm"].worker_id]
    (w,) = rows(settings, Worker, Worker.id == pool["vllm"].worker_id)
    assert w.reason == "pool_shrink"
    assert len(provider(loop).started) == 2  # nothing new


def test_the_free_pool_offers_a_deployment_only_its_own_engines_workers() -> None:
    free = FreePool(
        [
            Worker(id="wrk_b", accelerator="cpu", engine="builtin"),
            Worker(id="wrk_v", accelerator="cpu", engine="vllm"),
            Worker(id="wrk_g", accelerator="h100", engine="vllm"),
        ]
    )
    assert [c.worker_id for c in free.candidates("cpu", "vllm", "s3://b/m")] == ["wrk_v"]
    assert [c.worker_id for c in free.candidates("cpu", "builtin", "s3://b/m")] == ["wrk_b"]

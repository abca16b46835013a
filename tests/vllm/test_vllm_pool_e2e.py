"""The warm pool's vLLM workers on the embedded platform (real processes, the real vLLM
environment; `platform up` keeps one pool worker): with only a vLLM deployment live, the pool
boots a vLLM pool worker (`python -m worker --pool --engine vllm` with PLATFORM_VLLM_PYTHON),
which imports vLLM before any call; a call at zero is then served by it, no process booting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from control_plane.db.models import Worker
from control_plane.db.session import make_engine, make_sessionmaker
from sdk import Client, RunStatus
from tests.e2e.conftest import cli, embedded_platform
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    state = tmp_path_factory.mktemp("vllm-pool-platform")
    env = {"PLATFORM_VLLM_PYTHON": str(vllm_python), "PLATFORM_WARM_POOL_MAX": "1"}
    with embedded_platform(state, env) as p:
        yield p


def idle_pool_worker(database_url: str) -> Worker | None:
    with make_sessionmaker(make_engine(database_url))() as s:
        return s.scalars(
            select(Worker).where(Worker.deployment_id.is_(None), Worker.state == "idle")
        ).first()


def test_a_vllm_call_at_zero_is_served_by_a_vllm_pool_worker(
    platform: dict[str, Any], tiny_models: dict[str, Path]
) -> None:
    up = cli("models", "upload", str(tiny_models["llama"]), "models/pool-v/", env=platform["env"])
    assert up.returncode == 0, up.stdout + up.stderr
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=300)
    dep = client.deployments.create(name="pool-v", model="store://models/pool-v/", engine="vllm")
    assert dep.engine_resolved == "vllm", dep
    pooled = wait_for(
        lambda: idle_pool_worker(platform["database_url"]),
        300,
        every_s=0.2,
        what="an idle vLLM pool worker",
    )
    assert pooled.engine == "vllm"
    log_path = platform["state_dir"] / "logs" / "workers" / f"{pooled.id}.log"
    assert "in the warm pool, engine vllm" in log_path.read_text()

    seen: list[RunStatus] = []
    stream = client.run(
        "pool-v", {"prompt": "Hi", "max_tokens": 4}, stream=True, on_status=seen.append
    )
    "".join(stream)
    assert stream.job is not None and stream.job.status == "succeeded"
    # the vLLM pool worker served it: no process booted for this call
    (worker,) = client.workers.list(deployment="pool-v")
    assert (worker["id"], worker["engine"]) == (pooled.id, "vllm")
    phases = [s.phase for s in seen if s.status == "starting"]
    assert phases and phases[0] == "assigning_warm_worker", phases
    assert "booting" not in phases
    assert "assigned to deployment" in log_path.read_text()
    client.deployments.delete("pool-v")

"""The embedded platform with PLATFORM_PROVIDER=kubernetes: its reconciler starts workers as pods
on the test API server, and the test kubelet runs them as real worker processes. A sync call
boots a worker pod and is answered by it; scale-down deletes the pod with its drain grace, the
worker drains and the pod's end is reaped as a stop."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from control_plane.embedded.state import load_or_create_credentials
from sdk import Client
from tests.e2e.conftest import build_demo_model, cli, embedded_platform
from tests.helpers import wait_for
from tests.k8s.apiserver import ApiServer
from tests.k8s.conftest import NAMESPACE, REPO, WORKER_IMAGE, put_worker_token, start_kubelet
from tests.k8s.kubelet import Image, Kubelet, subprocess_env

pytestmark = pytest.mark.e2e
DRAIN_GRACE_S = 30


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiServer, Kubelet, Path]]:
    """The API server, a kubelet whose worker image is this checkout, and a kubeconfig."""
    server = ApiServer().start()
    image = Image(sys.executable, REPO, {**subprocess_env(), "HOME": str(tmp_path)})
    node = start_kubelet(server, tmp_path / "kubelet", {WORKER_IMAGE: image})
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(json.dumps(server.kubeconfig(NAMESPACE)))
    yield server, node, kubeconfig
    if (tmp_path / "platform" / "platform.json").exists():
        # a failed test left it up (embedded_platform stops it only on success)
        cli("down", "--state-dir", str(tmp_path / "platform"), env=dict(os.environ))
    node.stop()
    server.stop()
    assert node.problems == [], node.problems


@pytest.mark.timeout(180)
def test_a_sync_call_runs_in_a_worker_pod_deleted_with_grace_on_scale_down(
    cluster: tuple[ApiServer, Kubelet, Path], tmp_path: Path
) -> None:
    server, node, kubeconfig = cluster
    state_dir = tmp_path / "platform"
    state_dir.mkdir()
    # the token `platform up` will use, in the Secret its pods read it from
    put_worker_token(server, load_or_create_credentials(state_dir).worker_token)
    model = build_demo_model(tmp_path / "model")
    extra = {
        "PLATFORM_PROVIDER": "kubernetes",
        "PLATFORM_KUBERNETES_KUBECONFIG": str(kubeconfig),
        "PLATFORM_KUBERNETES_WORKER_IMAGE": WORKER_IMAGE,
        "PLATFORM_KUBERNETES_DRAIN_GRACE_S": str(DRAIN_GRACE_S),
        # a worker per call, started with the deployment's storage Secret (no pool to assign)
        "PLATFORM_WARM_POOL_MAX": "0",
    }
    with embedded_platform(state_dir, extra) as platform:
        up = cli("models", "upload", str(model), "models/k8s/", env=platform["env"])
        assert up.returncode == 0, up.stdout + up.stderr
        client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
        client.deployments.create(name="k8s", model="store://models/k8s/", scaledown_window_s=6)
        text = client.run("k8s", input={"prompt": "The weather", "max_tokens": 4})
        assert isinstance(text, str) and text
        _every_process_is_scraped(platform)

        (worker,) = client.workers.list("k8s")
        pod_name = _pod_of(server, worker["id"])
        pod = server.get("pods", NAMESPACE, pod_name)
        assert pod is not None and pod["spec"]["terminationGracePeriodSeconds"] == DRAIN_GRACE_S
        # the storage credentials are in the worker's Secret, not in its pod
        assert platform["env"]["AWS_SECRET_ACCESS_KEY"] not in json.dumps(pod)
        assert f"{pod_name}-assignment" in server.names("secrets")

        # idle past its scale-down window: drained, its pod deleted with the grace
        wait_for(
            lambda: client.workers.list("k8s")[0]["state"] in ("stopped", "failed"),
            timeout_s=90,
            every_s=0.1,
            what="the worker to stop",
        )
        assert client.workers.list("k8s")[0]["state"] == "stopped"  # exit 0: drained
        (delete, *_) = server.deletes("pods", pod_name)
        assert delete.grace_s() == DRAIN_GRACE_S
        assert (pod_name, "SIGTERM") in node.actions and (pod_name, "SIGKILL") not in node.actions
        wait_for(
            lambda: server.get("pods", NAMESPACE, pod_name) is None,
            timeout_s=90,
            every_s=0.1,
            what="the pod to go",
        )
        assert f"{pod_name}-assignment" not in server.names("secrets")
        client.deployments.delete("k8s")
    assert node.running() == []


def _pod_of(server: ApiServer, worker_id: str) -> str:
    for name in server.names("pods", NAMESPACE):
        pod = server.get("pods", NAMESPACE, name)
        if pod and pod["metadata"]["labels"].get("platform-serverless.io/worker-id") == worker_id:
            return name
    raise AssertionError(f"no pod of worker {worker_id}")


def _every_process_is_scraped(platform: dict[str, Any]) -> None:
    """The control plane's /metrics (the API, the reconciler's cold start and Celery's events
    in one multiprocess directory here), and the worker pod's own, found by HTTP SD."""
    auth = {"Authorization": f"Bearer {platform['api_key']}"}
    plane = httpx.get(platform["url"] + "/metrics", headers=auth, timeout=10)
    assert plane.status_code == 200
    names = {f.name for f in text_string_to_metric_families(plane.text)}
    assert {"platform_cold_starts", "platform_http_requests"} <= names, sorted(names)[:20]

    def targets() -> list[str]:
        groups = httpx.get(platform["url"] + "/metrics/workers", headers=auth, timeout=10).json()
        return [t for g in groups for t in g["targets"]]

    (target,) = wait_for(targets, timeout_s=30, what="the worker pod's metrics address")
    worker = httpx.get(f"http://{target}/metrics", timeout=10)
    assert worker.status_code == 200
    families = {f.name for f in text_string_to_metric_families(worker.text)}
    assert "platform_worker_generation_tokens" in families, sorted(families)[:20]

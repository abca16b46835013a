"""The Kubernetes provider against the test API server (real HTTP, official schemas) and the
test kubelet running the stub worker image (the real worker CLI, no runtime)."""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.messages import Assignment
from control_plane.providers.base import Exited, WorkerSpec
from control_plane.providers.kubernetes import KubernetesProvider
from control_plane.providers.kubernetes.pods import pod_name, secret_name
from control_plane.settings import Settings
from tests.helpers import wait_for
from tests.k8s.apiserver import ApiServer
from tests.k8s.conftest import NAMESPACE
from tests.k8s.kubelet import Kubelet

# what the reconciler passes (worker_env): the stub needs no torch threads
WORKER_ENV = {"PLATFORM_WORKER_THREADS": "0", "PLATFORM_REDIS_URL": "redis://127.0.0.1:1/0"}
STORAGE = {"AWS_ACCESS_KEY_ID": "AKTESTKEY", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value-never-in-spec"}


def assigned(worker_id: str) -> WorkerSpec:
    a = Assignment("dep_1", 3, "s3://models/demo/", "platform.deployment.dep_1", 4, STORAGE)
    return WorkerSpec(worker_id, "cpu", a)


def reaped(provider: KubernetesProvider, worker_id: str, timeout_s: float = 15.0) -> Exited:
    seen: list[Exited] = []

    def ended() -> Exited | None:
        seen.extend(provider.reap())
        return next((e for e in seen if e.worker_id == worker_id), None)

    exited: Exited = wait_for(ended, timeout_s, what=f"{worker_id}'s end")
    assert [e.worker_id for e in seen].count(worker_id) == 1  # reported once
    return exited


def running(server: ApiServer, worker_id: str) -> bool:
    pod = server.get("pods", NAMESPACE, pod_name(worker_id))
    return pod is not None and pod["status"].get("phase") == "Running"


def up(stub_dir: Path, worker_id: str) -> bool:
    """The stub worker runs, and drains on SIGTERM."""
    return (stub_dir / f"{worker_id}.env.json").exists()


@pytest.fixture
def provider(k8s_settings: Settings) -> Iterator[KubernetesProvider]:
    p = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    yield p
    p.close()


def test_a_started_worker_runs_in_a_pod_with_its_credentials_only_in_its_secret(
    apiserver: ApiServer,
    kubelet: Kubelet,
    provider: KubernetesProvider,
    stub_dir: Path,
    worker_token: str,
) -> None:
    assert provider.start(assigned("wrk_a1")) is None  # no pid: a pod
    wait_for(lambda: running(apiserver, "wrk_a1"))
    pod = apiserver.get("pods", NAMESPACE, pod_name("wrk_a1"))
    assert pod is not None
    spec_text = json.dumps(pod)
    assert STORAGE["AWS_SECRET_ACCESS_KEY"] not in spec_text and worker_token not in spec_text
    secret = apiserver.get("secrets", NAMESPACE, secret_name("wrk_a1"))
    assert secret is not None
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    # the container got both through its Secrets
    env = wait_for(lambda: _read_json(stub_dir / "wrk_a1.env.json"))
    assert env["AWS_SECRET_ACCESS_KEY"] == STORAGE["AWS_SECRET_ACCESS_KEY"]
    assert env["PLATFORM_WORKER_TOKEN"] == worker_token
    assert env["PLATFORM_WORKER_METRICS_HOST"] == "127.0.0.1"  # the pod IP


def test_stop_deletes_with_the_drain_grace_and_reaps_the_drained_exit(
    apiserver: ApiServer,
    kubelet: Kubelet,
    provider: KubernetesProvider,
    k8s_settings: Settings,
    stub_dir: Path,
) -> None:
    provider.start(assigned("wrk_s1"))
    wait_for(lambda: up(stub_dir, "wrk_s1"))
    provider.stop("wrk_s1")
    assert reaped(provider, "wrk_s1") == Exited("wrk_s1", 0)
    (delete, *_) = apiserver.deletes("pods", pod_name("wrk_s1"))
    assert delete.grace_s() == k8s_settings.kubernetes_drain_grace_s
    assert ("worker-wrk-s1", "SIGTERM") in kubelet.actions
    assert ("worker-wrk-s1", "SIGKILL") not in kubelet.actions
    wait_for(lambda: apiserver.get("pods", NAMESPACE, pod_name("wrk_s1")) is None)
    # its Secret went with it (owner reference)
    assert apiserver.get("secrets", NAMESPACE, secret_name("wrk_s1")) is None


def test_kill_deletes_with_grace_zero_and_reaps_a_kill(
    apiserver: ApiServer, kubelet: Kubelet, provider: KubernetesProvider
) -> None:
    provider.start(WorkerSpec("wrk_k1", "cpu", None))  # a warm-pool worker
    wait_for(lambda: running(apiserver, "wrk_k1"))
    provider.kill("wrk_k1")
    assert reaped(provider, "wrk_k1") == Exited("wrk_k1", -9)
    (delete,) = apiserver.deletes("pods", pod_name("wrk_k1"))
    assert delete.grace_s() == 0
    wait_for(lambda: ("worker-wrk-k1", "SIGKILL") in kubelet.actions)
    assert ("worker-wrk-k1", "SIGTERM") not in kubelet.actions


def test_reap_reports_the_exit_code_of_a_worker_that_ended_by_itself(
    apiserver: ApiServer, kubelet: Kubelet, provider: KubernetesProvider, stub_dir: Path
) -> None:
    (stub_dir / "wrk_e1.exit").write_text("3")
    provider.start(assigned("wrk_e1"))
    assert reaped(provider, "wrk_e1") == Exited("wrk_e1", 3)
    # the Failed pod is cleaned up, and its Secret
    wait_for(lambda: apiserver.get("pods", NAMESPACE, pod_name("wrk_e1")) is None)
    wait_for(lambda: apiserver.get("secrets", NAMESPACE, secret_name("wrk_e1")) is None)


def test_only_the_reaping_leader_cleans_up_an_ended_pod(
    apiserver: ApiServer, kubelet: Kubelet, k8s_settings: Settings, stub_dir: Path
) -> None:
    """A standby's watch sees the same end but deletes nothing: were it to remove the pod
    first, the leader could see a bare DELETED without the exit code."""
    (stub_dir / "wrk_e2.exit").write_text("4")
    leader = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    standby = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    try:
        leader.start(assigned("wrk_e2"))
        wait_for(lambda: _phase(apiserver, "wrk_e2") == "Failed")
        time.sleep(1.0)  # both watches have had the end
        assert apiserver.deletes("pods", pod_name("wrk_e2")) == []
        assert apiserver.get("secrets", NAMESPACE, secret_name("wrk_e2")) is not None
        assert reaped(leader, "wrk_e2") == Exited("wrk_e2", 4)
        assert apiserver.get("secrets", NAMESPACE, secret_name("wrk_e2")) is None
        wait_for(lambda: apiserver.get("pods", NAMESPACE, pod_name("wrk_e2")) is None)
    finally:
        standby.close()
        leader.close()


def test_starting_the_same_worker_twice_makes_one_pod(
    apiserver: ApiServer, provider: KubernetesProvider
) -> None:
    provider.start(assigned("wrk_d1"))
    provider.start(assigned("wrk_d1"))  # a retried tick: 409, already started
    creates = [r for r in apiserver.requests if r.method == "POST" and r.path.endswith("/pods")]
    assert [r.status for r in creates] == [201, 409]
    assert apiserver.names("pods") == [pod_name("wrk_d1")]


def test_the_watch_lists_again_after_410_gone_and_reports_what_ended_meanwhile(
    apiserver: ApiServer, provider: KubernetesProvider
) -> None:
    """No kubelet: the pods stay Pending. One vanishes while the history is compacted, so
    only a new LIST can tell."""
    for w in ("wrk_g1", "wrk_g2"):
        provider.start(WorkerSpec(w, "cpu", None))
    wait_for(lambda: _watching(apiserver))
    # the watch has seen both pods (a pod created after the first LIST arrives as an event:
    # compacted away before that, it would be a pod the provider never saw, not one that ended)
    wait_for(lambda: provider._watch.tracker.alive() >= {"wrk_g1", "wrk_g2"})
    apiserver.compact(forget=(("pods", NAMESPACE, pod_name("wrk_g1")),))
    assert reaped(provider, "wrk_g1") == Exited("wrk_g1", -9)
    calls = [
        "watch" if r.query.get("watch") else "list"
        for r in apiserver.requests
        if r.method == "GET" and r.path.endswith("/pods") and "labelSelector" in r.query
    ]
    assert calls[0] == "list" and "list" in calls[calls.index("watch") :]  # 410 → LIST
    # it watches on from the new LIST: the other pod's end still arrives
    provider.kill("wrk_g2")
    assert reaped(provider, "wrk_g2") == Exited("wrk_g2", -9)


def test_a_stopping_reconciler_leaves_its_pods_to_the_next_leader(
    apiserver: ApiServer, kubelet: Kubelet, k8s_settings: Settings, stub_dir: Path
) -> None:
    first = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    first.start(assigned("wrk_l1"))
    wait_for(lambda: up(stub_dir, "wrk_l1"))
    assert first.shutdown(timeout_s=10) == [], "a rollout of the reconcilers drains no worker"
    assert apiserver.deletes("pods", pod_name("wrk_l1")) == []
    second = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    try:  # the next leader finds the pod by its labels, and manages it
        second.stop("wrk_l1")
        assert reaped(second, "wrk_l1") == Exited("wrk_l1", 0)
    finally:
        second.close()


def test_delete_all_drains_every_worker_pod_of_the_platform(
    apiserver: ApiServer, kubelet: Kubelet, k8s_settings: Settings, stub_dir: Path
) -> None:
    provider = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    for w in ("wrk_x1", "wrk_x2"):
        provider.start(assigned(w))
    wait_for(lambda: up(stub_dir, "wrk_x1") and up(stub_dir, "wrk_x2"))
    exited = provider.delete_all(timeout_s=10)
    assert sorted(exited, key=lambda e: e.worker_id) == [Exited("wrk_x1", 0), Exited("wrk_x2", 0)]
    for w in ("wrk_x1", "wrk_x2"):
        (delete, *_) = apiserver.deletes("pods", pod_name(w))
        assert delete.grace_s() == k8s_settings.kubernetes_drain_grace_s


def test_closing_while_the_watch_ends_its_own_response_does_not_raise(
    apiserver: ApiServer, k8s_settings: Settings
) -> None:
    """`close` shuts the watch's response down to unblock its read; when the watch has just
    ended that response itself, the shutdown meets a closed socket (EBADF, seen once in a
    full run) and `close` goes on."""
    provider = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    response = wait_for(lambda: provider._watch.response)
    real_shutdown = type(response).shutdown

    def shutdown_of_a_closed_socket() -> None:
        real_shutdown(response)  # the read ends, as when the watch closes it first
        raise OSError(errno.EBADF, "Bad file descriptor")

    response.shutdown = shutdown_of_a_closed_socket
    provider.close()
    assert not provider._watch.thread.is_alive()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"kubernetes_worker_image": ""}, "PLATFORM_KUBERNETES_WORKER_IMAGE"),
        ({"accelerators": {"h100": 8}}, "PLATFORM_KUBERNETES_NODE_SELECTORS"),
        ({"accelerators": {"tpu9": 4}}, "PLATFORM_ACCELERATORS"),
        ({"kubernetes_worker_token_secret": "nope"}, "PLATFORM_KUBERNETES_WORKER_TOKEN_SECRET"),
    ],
)
def test_start_up_refuses_settings_that_cannot_work_naming_the_setting(
    k8s_settings: Settings, change: dict[str, Any], named: str
) -> None:
    settings = k8s_settings.model_copy(update=change)
    with pytest.raises(ValueError, match=named):
        KubernetesProvider.from_settings(settings, WORKER_ENV)


def test_start_up_refuses_a_worker_cache_setting_no_pod_could_mount(
    k8s_settings: Settings,
) -> None:
    env = {**WORKER_ENV, "PLATFORM_LOADER_HOST_CACHE_BYTES": "8Gi"}
    with pytest.raises(ValueError, match="PLATFORM_LOADER_HOST_CACHE_BYTES '8Gi'"):
        KubernetesProvider.from_settings(k8s_settings, env)


def test_start_up_names_what_rbac_denies(apiserver: ApiServer, k8s_settings: Settings) -> None:
    apiserver.deny |= {"watch pods", "update leases"}
    with pytest.raises(ValueError, match="RBAC") as info:
        KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    assert "watch pods" in str(info.value) and "update leases" in str(info.value)
    assert "create pods" not in str(info.value)


def test_start_up_names_an_unreachable_api(k8s_settings: Settings, apiserver: ApiServer) -> None:
    apiserver.stop()
    with pytest.raises(ValueError, match="PLATFORM_KUBERNETES_KUBECONFIG"):
        KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)


def _watching(server: ApiServer) -> bool:
    return any(r.query.get("watch") == "True" for r in server.requests)


def _read_json(path: Path) -> dict[str, str] | None:
    try:
        data: dict[str, str] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def _phase(server: ApiServer, worker_id: str) -> str | None:
    pod = server.get("pods", NAMESPACE, pod_name(worker_id))
    return None if pod is None else pod["status"].get("phase")

"""Worker pods that cannot start (providers/kubernetes/stuck.py), against the test API server:
an image that cannot be pulled ends its worker at once, a pod no node takes ends it after the
grace, each with the reason the kubelet or the scheduler gave, and its pod is deleted. (No
kubelet runs here: the pod's status is written as the kubelet or the scheduler would.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from control_plane.providers.base import WorkerSpec
from control_plane.providers.kubernetes import KubernetesProvider
from control_plane.providers.kubernetes.pods import pod_name
from control_plane.settings import Settings
from tests.helpers import wait_for
from tests.k8s.apiserver import ApiServer
from tests.k8s.conftest import NAMESPACE
from tests.k8s.test_kubernetes_provider import WORKER_ENV, reaped


@pytest.fixture
def provider(k8s_settings: Settings) -> Iterator[KubernetesProvider]:
    settings = k8s_settings.model_copy(update={"kubernetes_unschedulable_grace_s": 1.0})
    p = KubernetesProvider.from_settings(settings, WORKER_ENV)
    yield p
    p.close()


def _status(apiserver: ApiServer, worker_id: str, status: dict[str, Any]) -> None:
    name = pod_name(worker_id)
    wait_for(lambda: apiserver.get("pods", NAMESPACE, name) is not None)
    apiserver.replace("pods", NAMESPACE, name, {"status": status}, "status")


def test_an_image_that_cannot_be_pulled_fails_its_worker_at_once(
    apiserver: ApiServer, provider: KubernetesProvider
) -> None:
    provider.start(WorkerSpec("wrk_img", "cpu", None))
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}
    container = {"name": "worker", "ready": False, "restartCount": 0, "image": "nope:1",
                 "imageID": "", "state": {"waiting": waiting}}  # fmt: skip
    _status(apiserver, "wrk_img", {"phase": "Pending", "containerStatuses": [container]})
    exited = reaped(provider, "wrk_img")
    assert exited.returncode == -9
    assert exited.reason == 'image_pull: ImagePullBackOff: Back-off pulling image "nope:1"'
    wait_for(lambda: apiserver.get("pods", NAMESPACE, pod_name("wrk_img")) is None)


def test_a_pod_no_node_takes_fails_after_the_grace(
    apiserver: ApiServer, provider: KubernetesProvider
) -> None:
    provider.start(WorkerSpec("wrk_gpu", "cpu", None))
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message}  # fmt: skip
    _status(apiserver, "wrk_gpu", {"phase": "Pending", "conditions": [condition]})
    seen_at = time.monotonic()
    wait_for(lambda: "wrk_gpu" in provider._watch.tracker.waiting_for_a_node())
    assert provider.reap() == [], "within the grace: it may still get a node"
    exited = reaped(provider, "wrk_gpu")
    assert time.monotonic() - seen_at >= 1.0
    assert exited.reason == f"unschedulable: no node can take it: {message}"
    wait_for(lambda: apiserver.get("pods", NAMESPACE, pod_name("wrk_gpu")) is None)


def test_a_pod_that_gets_a_node_within_the_grace_is_left_alone(
    apiserver: ApiServer, provider: KubernetesProvider
) -> None:
    provider.start(WorkerSpec("wrk_late", "cpu", None))
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    _status(apiserver, "wrk_late", {"phase": "Pending", "conditions": [condition]})
    wait_for(lambda: "wrk_late" in provider._watch.tracker.waiting_for_a_node())
    scheduled = {"type": "PodScheduled", "status": "True"}
    _status(apiserver, "wrk_late", {"phase": "Pending", "conditions": [scheduled]})
    wait_for(lambda: not provider._watch.tracker.waiting_for_a_node())
    time.sleep(1.2)
    assert provider.reap() == []
    assert apiserver.get("pods", NAMESPACE, pod_name("wrk_late")) is not None


def test_a_pod_waiting_for_a_node_is_what_the_provider_says_waits(
    apiserver: ApiServer, provider: KubernetesProvider
) -> None:
    provider.start(WorkerSpec("wrk_wait", "cpu", None))
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/1 nodes are available"}  # fmt: skip
    _status(apiserver, "wrk_wait", {"phase": "Pending", "conditions": [condition]})
    wait_for(lambda: "wrk_wait" in provider.waiting())
    assert provider.waiting() == {
        "wrk_wait": "unschedulable: no node can take it: 0/1 nodes are available"
    }

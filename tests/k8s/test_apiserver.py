"""The test API server itself, through the official client: it must refuse what a real one
refuses, or the provider's tests would prove nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.k8s.apiserver import ApiServer
from tests.k8s.conftest import NAMESPACE


@pytest.fixture
def api(apiserver: ApiServer, kubeconfig: Path) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    with client.ApiClient(configuration) as c:
        yield c


def pod(name: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", **container}]},
    }


def test_an_invalid_pod_is_refused_with_422_and_a_status(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NAMESPACE, pod("bad", imagePullPolicie="Always"))
    assert info.value.status == 422
    status = json.loads(info.value.body)
    assert status["kind"] == "Status" and "imagePullPolicie" in status["message"]
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NAMESPACE, pod("bad", ports=[{"containerPort": "80"}]))
    assert info.value.status == 422
    core.create_namespaced_pod(NAMESPACE, pod("good"))
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NAMESPACE, pod("good"))
    assert info.value.status == 409


def test_a_lease_written_from_a_stale_read_is_a_conflict(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name="l"), spec=client.V1LeaseSpec(holder_identity="a")
    )
    leases.create_namespaced_lease(NAMESPACE, body)
    read = leases.read_namespaced_lease("l", NAMESPACE)
    read.spec.holder_identity = "b"
    leases.replace_namespaced_lease("l", NAMESPACE, read)
    read.spec.holder_identity = "c"  # still the old resourceVersion
    with pytest.raises(ApiException) as info:
        leases.replace_namespaced_lease("l", NAMESPACE, read)
    assert info.value.status == 409
    assert leases.read_namespaced_lease("l", NAMESPACE).spec.holder_identity == "b"


def test_a_watch_from_a_compacted_version_gets_410(
    apiserver: ApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(NAMESPACE, pod("p1"))
    version = core.list_namespaced_pod(NAMESPACE).metadata.resource_version
    core.create_namespaced_pod(NAMESPACE, pod("p2"))
    events = _watch(core, version)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "p2")]
    apiserver.compact()
    (error,) = _watch(core, version)
    assert error["type"] == "ERROR" and error["object"]["code"] == 410


def _watch(core: client.CoreV1Api, version: str) -> list[dict[str, Any]]:
    response = core.list_namespaced_pod(
        NAMESPACE, watch=True, resource_version=version, timeout_seconds=1, _preload_content=False
    )
    return [json.loads(line) for line in response.data.splitlines() if line.strip()]

"""A worker pod's log through the Kubernetes provider (`logs`: `read_namespaced_pod_log`)
against the test API server (real HTTP), which serves what the test kubelet's pod wrote."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from control_plane.domain.log_lines import iso
from control_plane.providers.kubernetes import KubernetesProvider
from control_plane.providers.kubernetes.pod_logs import PodLogs, since_seconds
from control_plane.providers.kubernetes.pods import pod_name
from control_plane.settings import Settings
from tests.helpers import wait_for
from tests.k8s.apiserver import ApiServer
from tests.k8s.kubelet import Kubelet
from tests.k8s.objects import flag
from tests.k8s.test_kubernetes_provider import WORKER_ENV, assigned, running


@pytest.fixture
def provider(
    apiserver: ApiServer, kubelet: Kubelet, k8s_settings: Settings
) -> Iterator[KubernetesProvider]:
    apiserver.log_dir = kubelet.log_dir  # the pods' output, as the kubelet writes it
    p = KubernetesProvider.from_settings(k8s_settings, WORKER_ENV)
    yield p
    p.close()


def _write(kubelet: Kubelet, worker_id: str, message: str, at: datetime) -> str:
    """A line the pod's container writes (its stdout), as the platform's logs write them."""
    line = json.dumps({"timestamp": iso(at), "level": "INFO", "component": "worker",
                       "message": message, "worker_id": worker_id})  # fmt: skip
    with (kubelet.log_dir / f"{pod_name(worker_id)}.log").open("a") as f:
        f.write(line + "\n")
    return line


def _started(apiserver: ApiServer, provider: KubernetesProvider, worker_id: str) -> None:
    provider.start(assigned(worker_id))
    wait_for(lambda: running(apiserver, worker_id))


def test_a_pods_log_is_read_with_since_as_since_seconds(
    apiserver: ApiServer, kubelet: Kubelet, provider: KubernetesProvider
) -> None:
    _started(apiserver, provider, "wrk_l1")
    now = datetime.now(UTC)
    old = _write(kubelet, "wrk_l1", "an hour ago", now - timedelta(hours=1))
    new = _write(kubelet, "wrk_l1", "just now", now)
    every = list(provider.logs("wrk_l1", None, follow=False))
    assert old in every and new in every
    recent = list(provider.logs("wrk_l1", now - timedelta(minutes=5), follow=False))
    assert new in recent and old not in recent
    asked = [r for r in apiserver.requests if r.path.endswith(f"/pods/{pod_name('wrk_l1')}/log")]
    assert asked[-1].query.get("sinceSeconds") in {"300", "301"}
    assert "sinceSeconds" not in asked[0].query


def test_following_a_pods_log_gives_new_lines_until_closed(
    apiserver: ApiServer, kubelet: Kubelet, provider: KubernetesProvider
) -> None:
    _started(apiserver, provider, "wrk_l2")
    _write(kubelet, "wrk_l2", "before", datetime.now(UTC))
    stream = provider.logs("wrk_l2", None, follow=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(stream), daemon=True)
    reader.start()
    wait_for(lambda: any("before" in s for s in seen), what="the line written before")
    later = _write(kubelet, "wrk_l2", "after the follow began", datetime.now(UTC))
    wait_for(lambda: later in seen, what="the line written during the follow")
    asked = [r for r in apiserver.requests if r.path.endswith(f"/pods/{pod_name('wrk_l2')}/log")]
    assert flag(asked[-1].query.get("follow"))
    stream.close()  # wakes the reader blocked on the open answer
    reader.join(timeout=5)
    assert not reader.is_alive()


def test_no_pod_no_log_and_a_missing_pod_is_no_error(
    apiserver: ApiServer, k8s_settings: Settings
) -> None:
    source = PodLogs.from_settings(k8s_settings)
    assert list(source.logs("wrk_gone", None, follow=False)) == []
    assert list(source.logs("wrk_gone", None, follow=True)) == []


def test_since_seconds_rounds_up_to_whole_seconds() -> None:
    now = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
    assert since_seconds(None, now) is None
    assert since_seconds(now - timedelta(seconds=90.2), now) == 91
    assert since_seconds(now, now) == 1  # the API refuses 0
    assert since_seconds(now + timedelta(seconds=5), now) == 1  # a clock ahead: still valid

"""Fixtures of the Kubernetes provider's tests: the test API server (apiserver.py), a kubeconfig
pointing at it, and a test kubelet (kubelet.py) running pods as local processes. Each stops at
the end of its test, killing every process it started; a pod the kubelet could not boot fails
the test."""

from __future__ import annotations

import base64
import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.settings import Settings
from tests.k8s.apiserver import ApiServer
from tests.k8s.kubelet import Image, Kubelet, subprocess_env

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "default"
TOKEN_SECRET = "platform-worker-token"
STUB_IMAGE = "registry.test/platform-worker:stub"
WORKER_IMAGE = "registry.test/platform-worker:test"


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer().start()
    yield server
    server.stop()


def put_worker_token(server: ApiServer, token: str) -> None:
    server.put({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN_SECRET, "namespace": NAMESPACE},
        "data": {"token": base64.b64encode(token.encode()).decode()},
    })  # fmt: skip


@pytest.fixture
def worker_token(apiserver: ApiServer) -> str:
    token = secrets.token_urlsafe(24)
    put_worker_token(apiserver, token)
    return token


@pytest.fixture
def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(json.dumps(apiserver.kubeconfig(NAMESPACE)))  # JSON is YAML
    return path


def start_kubelet(server: ApiServer, directory: Path, images: dict[str, Image]) -> Kubelet:
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    return Kubelet(server.url, "node-1", {"pool": "cpu"}, images, directory / "logs").start()


@pytest.fixture
def stub_dir(tmp_path: Path) -> Path:
    d = tmp_path / "stub"
    d.mkdir()
    return d


@pytest.fixture
def kubelet(apiserver: ApiServer, tmp_path: Path, stub_dir: Path) -> Iterator[Kubelet]:
    """A kubelet whose worker image is the stub (stub_worker.py): the real worker's CLI, no
    runtime."""
    image = Image(
        sys.executable,
        REPO,
        {**subprocess_env(), "HOME": str(tmp_path), "STUB_DIR": str(stub_dir)},
        module="tests.k8s.stub_worker",
    )
    node = start_kubelet(apiserver, tmp_path / "kubelet", {STUB_IMAGE: image})
    yield node
    node.stop()
    assert node.problems == [], node.problems


@pytest.fixture
def k8s_settings(kubeconfig: Path, worker_token: str) -> Settings:
    return Settings(
        provider="kubernetes",
        kubernetes_kubeconfig=str(kubeconfig),
        kubernetes_namespace=NAMESPACE,
        kubernetes_worker_image=STUB_IMAGE,
        kubernetes_drain_grace_s=5,
        worker_token=worker_token,
    )

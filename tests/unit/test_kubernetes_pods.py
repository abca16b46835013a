"""Worker pods as Kubernetes objects (control_plane/providers/kubernetes/: config.py, pods.py,
tracker.py): pure, checked against the official schemas (kubernetes_validate, strict: unknown
fields are errors)."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import kubernetes_validate
import pytest

from common.messages import ASSIGNMENT_ENV, Assignment
from common.protocol import HOST_CACHE_DIR
from control_plane.providers.base import Exited, WorkerSpec
from control_plane.providers.kubernetes.config import pod_config
from control_plane.providers.kubernetes.pods import (
    WORKER_ID_LABEL,
    assignment_secret_manifest,
    cache_volumes,
    owner_patch,
    pod_manifest,
    pod_name,
    secret_name,
)
from control_plane.providers.kubernetes.tracker import PodTracker
from control_plane.providers.local import worker_args
from control_plane.settings import Settings

K8S_VERSION = "1.33"
STORAGE = {"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "very-secret-key-value"}
ENV = {
    "PLATFORM_INTERNAL_URL": "http://api.platform.svc",
    "PLATFORM_REDIS_URL": "redis://redis:6379/0",
    "PLATFORM_WORKER_TOKEN": "token-that-is-long-enough",
    "PLATFORM_DATABASE_URL": "postgresql+psycopg://u:dbpassword@db/platform",
    "PATH": "/control-plane/bin",
    "HOME": "/root",
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "AWS_SECRET_ACCESS_KEY": "the-control-planes-own-key",
    "PLATFORM_ENGINE_BLOCK_SIZE": "16",
}


def settings(**change: Any) -> Settings:
    base: dict[str, Any] = {
        "provider": "kubernetes",
        "kubernetes_worker_image": "registry.example.com/platform-worker:1.0",
        "accelerators": {"h100": 8},
        "kubernetes_node_selectors": {"h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "kubernetes_tolerations": {
            "h100": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        },
        "kubernetes_worker_resources": {
            "h100": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "200Gi"}},
            "cpu": {"requests": {"cpu": 2}},
        },
        "kubernetes_service_account": "platform-worker",
        "kubernetes_drain_grace_s": 660.5,
    }
    return Settings(**{**base, **change})


def assigned(
    accelerator: str = "h100", worker_id: str = "wrk_0190a1b2c3d4e5f6a7b8c9"
) -> WorkerSpec:
    a = Assignment(
        "dep_42", 7, "s3://tenant-bucket/llama/", "platform.deployment.dep_42", 8, STORAGE
    )
    return WorkerSpec(worker_id, accelerator, a)


def valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_gpu_workers_pod_is_a_valid_pod_with_its_gpu_node_selector_and_tolerations() -> None:
    cfg = pod_config(settings())
    pod = pod_manifest(cfg, assigned(), ENV)
    valid(pod)
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["resources"]["limits"] == {"memory": "200Gi", "nvidia.com/gpu": "1"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 661  # never shorter than the drain budget
    assert spec["serviceAccountName"] == "platform-worker"
    assert spec["automountServiceAccountToken"] is False
    # the local provider's command line
    assert c["command"] == ["python", "-m", "worker"] and c["args"] == worker_args(assigned())
    assert c["image"] == "registry.example.com/platform-worker:1.0"


def test_a_vllm_worker_runs_the_vllm_image_with_its_gpus_on_one_pod() -> None:
    cfg = pod_config(settings(kubernetes_vllm_image="registry.example.com/platform-vllm:1.0"))
    base = assigned()
    assert base.assignment is not None
    spec = dataclasses.replace(
        base, assignment=dataclasses.replace(base.assignment, engine="vllm", accelerator_count=4)
    )
    pod = pod_manifest(cfg, spec, ENV)
    valid(pod)
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "registry.example.com/platform-vllm:1.0"
    assert c["resources"]["limits"] == {"memory": "200Gi", "nvidia.com/gpu": "4"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert c["command"] == ["python", "-m", "worker"] and c["args"] == worker_args(spec)
    assert pod["metadata"]["labels"]["platform-serverless.io/engine"] == "vllm"
    # the built-in engine's workers and its pool's keep the worker image and one GPU
    for other in (assigned(), WorkerSpec("wrk_pool2", "h100", None)):
        (c,) = pod_manifest(cfg, other, ENV)["spec"]["containers"]
        assert c["image"] == "registry.example.com/platform-worker:1.0"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # a vLLM pool worker: the vLLM image, one GPU, told to prepare vLLM while it waits
    pool_spec = WorkerSpec("wrk_pool3", "h100", None, pool_engine="vllm")
    pod = pod_manifest(cfg, pool_spec, ENV)
    valid(pod)
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "registry.example.com/platform-vllm:1.0"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["args"][-3:] == ["--pool", "--engine", "vllm"] and "envFrom" not in c
    labels = pod["metadata"]["labels"]
    assert labels["platform-serverless.io/engine"] == "vllm"
    assert labels["platform-serverless.io/pool"] == "true"
    # a type whose resources name one GPU: the worker's count wins
    one = settings(
        kubernetes_vllm_image="v:1",
        kubernetes_worker_resources={"h100": {"limits": {"nvidia.com/gpu": 1}}},
    )
    (c,) = pod_manifest(pod_config(one), spec, ENV)["spec"]["containers"]
    assert c["resources"] == {
        "limits": {"nvidia.com/gpu": "4"},
        "requests": {"nvidia.com/gpu": "4"},
    }


def test_a_vllm_platform_on_kubernetes_is_one_with_a_vllm_image() -> None:
    assert not settings().has_vllm()
    assert settings(kubernetes_vllm_image="v:1").has_vllm()
    # the local provider's python is not the cluster's
    assert not settings(vllm_python="/opt/vllm/bin/python").has_vllm()
    assert Settings(vllm_python="/opt/vllm/bin/python").has_vllm()


def test_a_cpu_worker_asks_for_no_gpu_and_a_pool_worker_boots_with_pool() -> None:
    cfg = pod_config(settings())
    pod = pod_manifest(cfg, WorkerSpec("wrk_pool1", "cpu", None), ENV)
    valid(pod)
    (c,) = pod["spec"]["containers"]
    assert c["resources"] == {"requests": {"cpu": "2"}}
    assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]
    assert c["args"][-3:] == ["--pool", "--engine", "builtin"] and "envFrom" not in c
    assert assignment_secret_manifest(cfg, WorkerSpec("wrk_pool1", "cpu", None)) is None
    assert pod["metadata"]["labels"]["platform-serverless.io/pool"] == "true"


def test_secrets_stay_out_of_the_pod_spec() -> None:
    cfg = pod_config(settings())
    spec = assigned()
    pod = pod_manifest(cfg, spec, ENV)
    text = json.dumps(pod)
    for secret in (*STORAGE.values(), ENV["PLATFORM_WORKER_TOKEN"], "dbpassword"):
        assert secret not in text
    assert "the-control-planes-own-key" not in text
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["PLATFORM_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "platform-worker-token",
        "key": "token",
    }
    # the control plane's host variables are not the worker's
    assert not {"PATH", "HOME", "KUBERNETES_SERVICE_HOST", "PLATFORM_DATABASE_URL"} & set(env)
    assert env["PLATFORM_INTERNAL_URL"]["value"] == ENV["PLATFORM_INTERNAL_URL"]
    assert env["PLATFORM_ENGINE_BLOCK_SIZE"]["value"] == "16"
    assert (
        env["PLATFORM_WORKER_METRICS_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    )
    (source,) = pod["spec"]["containers"][0]["envFrom"]
    assert source == {"secretRef": {"name": secret_name(spec.worker_id)}}

    secret = assignment_secret_manifest(cfg, spec)
    assert secret is not None
    valid(secret)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert list(data) == [ASSIGNMENT_ENV]
    assert Assignment.from_json(data[ASSIGNMENT_ENV]) == spec.assignment
    assert Assignment.from_json(data[ASSIGNMENT_ENV]).storage_env == STORAGE


def test_labels_carry_ids_only_and_select_this_platforms_pods() -> None:
    cfg = pod_config(settings(kubernetes_instance="prod"))
    labels = pod_manifest(cfg, assigned(), ENV)["metadata"]["labels"]
    assert labels[WORKER_ID_LABEL] == "wrk_0190a1b2c3d4e5f6a7b8c9"
    assert labels["platform-serverless.io/deployment-id"] == "dep_42"
    assert labels["platform-serverless.io/deployment-version"] == "7"
    assert labels["app.kubernetes.io/instance"] == "prod"
    # nothing from the model URI or the queue (tenant data)
    assert not any("tenant-bucket" in v or "llama" in v for v in labels.values())


def test_pod_names_are_deterministic_dns_labels() -> None:
    assert pod_name("wrk_0190a1b2c3d4e5f6a7b8c9") == "worker-wrk-0190a1b2c3d4e5f6a7b8c9"
    assert pod_name("wrk_x") == pod_name("wrk_x")
    odd = pod_name("Wrk.With.Dots_" + "x" * 80)
    assert len(odd) <= 63 and odd == odd.lower() and odd[-1].isalnum()
    assert pod_name("a.b") != pod_name("a-b")  # a digest keeps mangled ids apart


def test_owner_patch_points_at_the_pod() -> None:
    pod = {"metadata": {"name": "worker-wrk-1", "uid": "u-1"}}
    ref = owner_patch(pod)["metadata"]["ownerReferences"][0]
    assert ref == {"apiVersion": "v1", "kind": "Pod", "name": "worker-wrk-1", "uid": "u-1"}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"kubernetes_worker_image": ""}, "PLATFORM_KUBERNETES_WORKER_IMAGE is not set"),
        ({"accelerators": {"h100": 8, "a100": 4}}, "PLATFORM_KUBERNETES_NODE_SELECTORS"),
        ({"accelerators": {"tpu9": 4}}, "PLATFORM_ACCELERATORS: unknown accelerator type 'tpu9'"),
        (
            {"kubernetes_node_selectors": {"h100": {"a": "b"}, "h1OO": {"a": "b"}}},
            "PLATFORM_KUBERNETES_NODE_SELECTORS: unknown accelerator type 'h1OO'",
        ),
        (
            {"kubernetes_tolerations": {"h100": [{"key": "k", "tolerationSecs": 3}]}},
            "PLATFORM_KUBERNETES_TOLERATIONS",
        ),
        (
            {"kubernetes_tolerations": {"h100": [{"key": "k", "tolerationSeconds": "30"}]}},
            "tolerationSeconds is a whole number",
        ),
        (
            {"kubernetes_worker_resources": {"h100": {"request": {"cpu": "1"}}}},
            "PLATFORM_KUBERNETES_WORKER_RESOURCES",
        ),
        ({"kubernetes_namespace": "Not_A_Namespace"}, "PLATFORM_KUBERNETES_NAMESPACE"),
        (
            {"kubernetes_disk_cache_host_path": "var/cache/weights"},
            "PLATFORM_KUBERNETES_DISK_CACHE_HOST_PATH 'var/cache/weights' is not an absolute path",
        ),
        (
            {"kubernetes_disk_cache_claim": "w", "kubernetes_disk_cache_host_path": "/var/c"},
            "PLATFORM_KUBERNETES_DISK_CACHE_CLAIM and PLATFORM_KUBERNETES_DISK_CACHE_HOST_PATH",
        ),
        ({"kubernetes_disk_cache_claim": "Bad_Claim"}, "PLATFORM_KUBERNETES_DISK_CACHE_CLAIM"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_setting(
    change: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        pod_config(settings(**change))


CACHE_ENV = {
    **ENV,
    "PLATFORM_LOADER_CACHE_DIR": "/cache/weights",
    "PLATFORM_LOADER_HOST_CACHE_BYTES": str(8 << 30),
}


def test_cache_tiers_on_node_directories_outlive_the_pod() -> None:
    cfg = pod_config(
        settings(
            kubernetes_disk_cache_host_path="/var/cache/platform-weights",
            kubernetes_memory_cache_host_path="/dev/shm/platform-weights",
        )
    )
    pod = pod_manifest(cfg, WorkerSpec("wrk_c1", "h100", None), CACHE_ENV)
    valid(pod)
    assert pod["spec"]["volumes"] == [
        {"name": "weights-disk",
         "hostPath": {"path": "/var/cache/platform-weights", "type": "Directory"}},
        {"name": "weights-memory",
         "hostPath": {"path": "/dev/shm/platform-weights", "type": "Directory"}},
    ]  # fmt: skip
    (container,) = pod["spec"]["containers"]
    assert container["volumeMounts"] == [
        {"name": "weights-disk", "mountPath": "/cache/weights"},
        {"name": "weights-memory", "mountPath": HOST_CACHE_DIR},
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PLATFORM_LOADER_CACHE_DIR"] == "/cache/weights"  # where the worker looks


def test_the_disk_tier_on_a_claim_is_shared_by_the_workers_that_mount_it() -> None:
    cfg = pod_config(settings(kubernetes_disk_cache_claim="platform-weights"))
    pod = pod_manifest(cfg, WorkerSpec("wrk_c3", "h100", None), CACHE_ENV)
    valid(pod)
    assert pod["spec"]["volumes"][0] == {
        "name": "weights-disk",
        "persistentVolumeClaim": {"claimName": "platform-weights"},
    }
    assert pod["spec"]["containers"][0]["volumeMounts"][0] == {
        "name": "weights-disk",
        "mountPath": "/cache/weights",
    }


def test_cache_tiers_without_node_directories_last_one_pod() -> None:
    cfg = pod_config(settings())
    env = {**CACHE_ENV, "PLATFORM_LOADER_HOST_CACHE_DIR": "/dev/shm/w"}
    pod = pod_manifest(cfg, WorkerSpec("wrk_c2", "cpu", None), env)
    valid(pod)
    assert pod["spec"]["volumes"] == [
        {"name": "weights-disk", "emptyDir": {}},
        {"name": "weights-memory", "emptyDir": {"medium": "Memory", "sizeLimit": str(8 << 30)}},
    ]
    assert pod["spec"]["containers"][0]["volumeMounts"][1]["mountPath"] == "/dev/shm/w"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"PLATFORM_LOADER_HOST_CACHE_BYTES": "8Gi"}, "PLATFORM_LOADER_HOST_CACHE_BYTES '8Gi'"),
        ({"PLATFORM_LOADER_CACHE_DIR": "cache"}, "PLATFORM_LOADER_CACHE_DIR 'cache' is not an"),
        ({"PLATFORM_LOADER_HOST_CACHE_DIR": "shm/w"}, "PLATFORM_LOADER_HOST_CACHE_DIR 'shm/w'"),
    ],
)
def test_cache_settings_no_pod_could_mount_are_refused_naming_them(
    change: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        cache_volumes(pod_config(settings()), {**CACHE_ENV, **change})


def test_no_cache_tier_no_volume() -> None:
    pod = pod_manifest(pod_config(settings()), WorkerSpec("wrk_c3", "cpu", None), ENV)
    assert "volumes" not in pod["spec"] and "volumeMounts" not in pod["spec"]["containers"][0]


def _pod(worker_id: str, phase: str, code: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if code is not None:
        status["containerStatuses"] = [
            {"name": "worker", "state": {"terminated": {"exitCode": code}}}
        ]
    return {"metadata": {"name": pod_name(worker_id), "labels": {WORKER_ID_LABEL: worker_id}},
            "status": status}  # fmt: skip


def test_the_tracker_reports_each_end_once_with_its_exit_code() -> None:
    t = PodTracker()
    assert t.relist([_pod("w1", "Running"), _pod("w2", "Pending")]) == []
    assert t.observe("MODIFIED", _pod("w1", "Failed", 3)) == [Exited("w1", 3)]
    assert t.observe("DELETED", _pod("w1", "Failed", 3)) == []  # the same end
    # deleted while it ran, no exit of its own: killed
    assert t.observe("DELETED", _pod("w2", "Running")) == [Exited("w2", -9)]
    # a graceful delete: the drained exit, seen as the pod goes
    t.observe("ADDED", _pod("w3", "Running"))
    assert t.observe("DELETED", _pod("w3", "Succeeded", 0)) == [Exited("w3", 0)]
    assert t.alive() == set()


def test_a_relist_reports_the_pods_that_went_while_unwatched() -> None:
    t = PodTracker()
    t.relist([_pod("w1", "Running"), _pod("w2", "Running"), _pod("w3", "Running")])
    # after a 410: w1 is gone, w2 ended, w3 still runs
    out = t.relist([_pod("w2", "Succeeded", 0), _pod("w3", "Running")])
    assert out == [Exited("w1", -9), Exited("w2", 0)]
    assert t.alive() == {"w3"}
    assert t.relist([_pod("w3", "Running")]) == []  # w2 reported once, even gone now

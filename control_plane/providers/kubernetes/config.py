"""What every worker pod shares (`PodConfig`), read once from the settings and checked there:
`pod_config` raises ValueError naming the setting that could not work (pure: no I/O)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from control_plane.settings import Settings

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


@dataclass(frozen=True, slots=True)
class PodConfig:
    """What every worker pod shares, checked once from the settings (`pod_config`)."""

    namespace: str  # of the pods, their Secrets and the worker-token Secret
    image: str  # worker image; its `python` runs `-m worker`
    pull_policy: str  # Always | IfNotPresent | Never
    service_account: str  # of the worker pods; "" = the namespace's default
    token_secret: str  # Secret holding PLATFORM_WORKER_TOKEN …
    token_key: str  # … under this key
    node_selectors: Mapping[str, Mapping[str, str]]  # accelerator type → node labels
    tolerations: Mapping[str, list[dict[str, Any]]]  # accelerator type → pod tolerations
    resources: Mapping[str, Mapping[str, Mapping[str, str]]]  # type → requests/limits
    gpu_resource: str  # extended resource of one GPU (nvidia.com/gpu)
    grace_s: int  # terminationGracePeriodSeconds: a stop's drain budget
    # how long a pod may wait for a node before its worker fails as unschedulable
    unschedulable_grace_s: float
    metrics_port: int  # the worker's /metrics, on the pod IP
    instance: str  # app.kubernetes.io/instance: this platform's pods among others'
    disk_cache_host_path: str = ""  # node directory of the disk cache tier; "" = emptyDir
    disk_cache_claim: str = ""  # or a PersistentVolumeClaim behind it; "" = none
    memory_cache_host_path: str = ""  # node tmpfs directory of the memory tier; "" = emptyDir
    vllm_image: str = ""  # image of vLLM workers (engine vllm); "" = no vLLM on this platform


def pod_config(settings: Settings) -> PodConfig:
    """The settings as a PodConfig; ValueError naming the setting when they cannot work."""
    if not settings.kubernetes_worker_image:
        raise ValueError(
            "PLATFORM_KUBERNETES_WORKER_IMAGE is not set (the worker image, e.g. "
            "registry.example.com/platform-worker:1.0)"
        )
    known = set(settings.rates_per_s)
    for setting, types in (
        ("PLATFORM_ACCELERATORS", settings.accelerators),
        ("PLATFORM_KUBERNETES_NODE_SELECTORS", settings.kubernetes_node_selectors),
        ("PLATFORM_KUBERNETES_TOLERATIONS", settings.kubernetes_tolerations),
        ("PLATFORM_KUBERNETES_WORKER_RESOURCES", settings.kubernetes_worker_resources),
    ):
        unknown = sorted(set(types) - known)
        if unknown:
            raise ValueError(
                f"{setting}: unknown accelerator type {', '.join(map(repr, unknown))} "
                f"(known: those of PLATFORM_RATES_PER_S: {', '.join(sorted(known))})"
            )
    # A GPU pod without a node selector could land on any GPU: the wrong hardware, billed at
    # this type's rate. The CPU needs none.
    missing = sorted(
        a
        for a in settings.accelerators
        if a != "cpu" and not settings.kubernetes_node_selectors.get(a)
    )
    if missing:
        raise ValueError(
            f"PLATFORM_KUBERNETES_NODE_SELECTORS has no node selector for accelerator type "
            f"{', '.join(map(repr, missing))} (listed in PLATFORM_ACCELERATORS), e.g. "
            '{"h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}'
        )
    for accelerator, tolerations in settings.kubernetes_tolerations.items():
        for t in tolerations:
            extra = sorted(set(t) - _TOLERATION_KEYS)
            if extra:
                raise ValueError(
                    f"PLATFORM_KUBERNETES_TOLERATIONS[{accelerator!r}]: unknown field "
                    f"{', '.join(extra)} (a toleration has {', '.join(sorted(_TOLERATION_KEYS))})"
                )
            if not all(isinstance(t[k], int) == (k == "tolerationSeconds") for k in t):
                raise ValueError(
                    f"PLATFORM_KUBERNETES_TOLERATIONS[{accelerator!r}]: tolerationSeconds is a "
                    "whole number, every other field a string"
                )
    for accelerator, resources in settings.kubernetes_worker_resources.items():
        extra = sorted(set(resources) - {"requests", "limits"})
        if extra:
            raise ValueError(
                f"PLATFORM_KUBERNETES_WORKER_RESOURCES[{accelerator!r}]: unknown field "
                f"{', '.join(extra)} (only requests and limits)"
            )
    if not DNS_LABEL.fullmatch(settings.kubernetes_namespace):
        raise ValueError(
            f"PLATFORM_KUBERNETES_NAMESPACE {settings.kubernetes_namespace!r} is not a "
            "namespace name"
        )
    if (
        not LABEL_VALUE.fullmatch(settings.kubernetes_instance)
        or len(settings.kubernetes_instance) > 63
    ):
        raise ValueError(
            f"PLATFORM_KUBERNETES_INSTANCE {settings.kubernetes_instance!r} is not a label value"
        )
    claim = settings.kubernetes_disk_cache_claim
    if claim and settings.kubernetes_disk_cache_host_path:
        raise ValueError(
            "PLATFORM_KUBERNETES_DISK_CACHE_CLAIM and PLATFORM_KUBERNETES_DISK_CACHE_HOST_PATH "
            "are both set: the disk cache tier is one or the other"
        )
    if claim and (not DNS_LABEL.fullmatch(claim.replace(".", "-")) or len(claim) > 253):
        raise ValueError(f"PLATFORM_KUBERNETES_DISK_CACHE_CLAIM {claim!r} is not a claim name")
    for name, path in (
        ("PLATFORM_KUBERNETES_DISK_CACHE_HOST_PATH", settings.kubernetes_disk_cache_host_path),
        ("PLATFORM_KUBERNETES_MEMORY_CACHE_HOST_PATH", settings.kubernetes_memory_cache_host_path),
    ):
        if path:
            absolute(name, path)
    return PodConfig(
        namespace=settings.kubernetes_namespace,
        image=settings.kubernetes_worker_image,
        pull_policy=settings.kubernetes_image_pull_policy,
        service_account=settings.kubernetes_service_account,
        token_secret=settings.kubernetes_worker_token_secret,
        token_key=settings.kubernetes_worker_token_secret_key,
        node_selectors=settings.kubernetes_node_selectors,
        tolerations={a: [dict(t) for t in ts] for a, ts in settings.kubernetes_tolerations.items()},
        resources={
            a: {part: {k: str(v) for k, v in q.items()} for part, q in r.items()}
            for a, r in settings.kubernetes_worker_resources.items()
        },
        gpu_resource=settings.kubernetes_gpu_resource,
        grace_s=math.ceil(settings.kubernetes_drain_grace_s),
        unschedulable_grace_s=settings.kubernetes_unschedulable_grace_s,
        metrics_port=settings.kubernetes_worker_metrics_port,
        instance=settings.kubernetes_instance,
        disk_cache_host_path=settings.kubernetes_disk_cache_host_path,
        disk_cache_claim=settings.kubernetes_disk_cache_claim,
        memory_cache_host_path=settings.kubernetes_memory_cache_host_path,
        vllm_image=settings.kubernetes_vllm_image,
    )


def absolute(name: str, path: str) -> None:
    if not path.startswith("/"):
        raise ValueError(f"{name} {path!r} is not an absolute path")

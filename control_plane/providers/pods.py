"""Worker pods as Kubernetes objects, and which pods ended (pure: no I/O, no client).

The Kubernetes provider (kubernetes.py) builds every pod and Secret here from the settings
(`pod_config`) and a WorkerSpec, and feeds what its LIST and WATCH return to a `PodTracker`.

    cfg = pod_config(settings)                       # ValueError naming the setting
    pod_manifest(cfg, WorkerSpec("wrk_…", "h100", assignment), env)   # a v1 Pod, as a dict
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common.protocol import CREDENTIAL_ENV, HOST_CACHE_DIR, METRICS_HOST_ENV, METRICS_PORT_ENV
from control_plane.providers.base import Exited, WorkerSpec
from control_plane.providers.local import assignment_env, worker_args
from control_plane.settings import Settings

LABEL_PREFIX = "platform-serverless.io"
WORKER_ID_LABEL = f"{LABEL_PREFIX}/worker-id"
CONTAINER = "worker"
# Never in a pod spec: the worker token comes from its Secret (secretKeyRef), storage
# credentials from the worker's own Secret, and workers hold no database credentials at all.
SPEC_FORBIDDEN_ENV = frozenset(
    {"PLATFORM_WORKER_TOKEN", "PLATFORM_DATABASE_URL", "PLATFORM_SECRET_KEY", *CREDENTIAL_ENV}
)
# The control plane's own host or container, not the worker's: a pod gets these from its image
# and its kubelet (KUBERNETES_* service links), and the provider sets the metrics address.
HOST_ENV = frozenset(
    {"PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "USER", "LOGNAME",
     "SHELL", "VIRTUAL_ENV", "TMPDIR", METRICS_HOST_ENV, METRICS_PORT_ENV}
)  # fmt: skip
HOST_ENV_PREFIXES = ("KUBERNETES_",)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
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
    metrics_port: int  # the worker's /metrics, on the pod IP
    instance: str  # app.kubernetes.io/instance: this platform's pods among others'
    disk_cache_host_path: str = ""  # node directory of the disk cache tier; "" = emptyDir
    memory_cache_host_path: str = ""  # node tmpfs directory of the memory tier; "" = emptyDir


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
    if not _DNS_LABEL.match(settings.kubernetes_namespace):
        raise ValueError(
            f"PLATFORM_KUBERNETES_NAMESPACE {settings.kubernetes_namespace!r} is not a "
            "namespace name"
        )
    if (
        not _LABEL_VALUE.match(settings.kubernetes_instance)
        or len(settings.kubernetes_instance) > 63
    ):
        raise ValueError(
            f"PLATFORM_KUBERNETES_INSTANCE {settings.kubernetes_instance!r} is not a label value"
        )
    for name, path in (
        ("PLATFORM_KUBERNETES_DISK_CACHE_HOST_PATH", settings.kubernetes_disk_cache_host_path),
        ("PLATFORM_KUBERNETES_MEMORY_CACHE_HOST_PATH", settings.kubernetes_memory_cache_host_path),
    ):
        if path:
            _absolute(name, path)
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
        metrics_port=settings.kubernetes_worker_metrics_port,
        instance=settings.kubernetes_instance,
        disk_cache_host_path=settings.kubernetes_disk_cache_host_path,
        memory_cache_host_path=settings.kubernetes_memory_cache_host_path,
    )


def selector_labels(instance: str) -> dict[str, str]:
    """The labels every worker pod of this platform carries: its LIST/WATCH selector."""
    return {
        "app.kubernetes.io/name": "platform-worker",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/managed-by": "platform-control-plane",
    }


def label_selector(instance: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(instance).items())


def pod_name(worker_id: str) -> str:
    """The worker's pod, named after its id (deterministic: a second create of the same worker
    is a 409, never a second pod), a DNS label of at most 63 characters (its hostname)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", worker_id.lower()).strip("-")
    name = f"worker-{slug}"
    if len(name) > 63 or slug != worker_id.replace("_", "-").lower():
        # not a plain id: keep it unique with a digest of the id itself
        digest = hashlib.sha256(worker_id.encode()).hexdigest()[:10]
        name = f"{name[:52].rstrip('-')}-{digest}"
    return name


def secret_name(worker_id: str) -> str:
    return f"{pod_name(worker_id)}-assignment"


def worker_labels(cfg: PodConfig, spec: WorkerSpec) -> dict[str, str]:
    """Ids only (deployment, version, worker, accelerator): never tenant data such as names."""
    if not _LABEL_VALUE.match(spec.worker_id) or len(spec.worker_id) > 63:
        raise ValueError(f"worker id {spec.worker_id!r} is not a label value")
    labels = {
        **selector_labels(cfg.instance),
        WORKER_ID_LABEL: spec.worker_id,
        f"{LABEL_PREFIX}/accelerator": spec.accelerator,
        f"{LABEL_PREFIX}/pool": "true" if spec.assignment is None else "false",
    }
    if spec.assignment is not None:
        labels[f"{LABEL_PREFIX}/deployment-id"] = spec.assignment.deployment_id
        labels[f"{LABEL_PREFIX}/deployment-version"] = str(spec.assignment.deployment_version)
    return labels


def pod_env(cfg: PodConfig, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The container's env: the workers' environment less secrets and host variables, the
    worker token by secretKeyRef, the metrics address on the pod IP."""
    out: list[dict[str, Any]] = [
        {"name": k, "value": v}
        for k, v in sorted(env.items())
        if k not in SPEC_FORBIDDEN_ENV and k not in HOST_ENV and not k.startswith(HOST_ENV_PREFIXES)
    ]
    out += [
        {
            "name": "PLATFORM_WORKER_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": cfg.token_secret, "key": cfg.token_key}},
        },
        {"name": METRICS_HOST_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": METRICS_PORT_ENV, "value": str(cfg.metrics_port)},
    ]
    return out


def container_resources(cfg: PodConfig, accelerator: str) -> dict[str, dict[str, str]]:
    """The type's requests/limits, plus its one GPU (one worker per GPU) unless it is `cpu`."""
    own = cfg.resources.get(accelerator, {})
    out = {part: dict(own.get(part, {})) for part in ("requests", "limits")}
    if accelerator != "cpu":
        # an extended resource: requests must equal limits, and the scheduler counts limits
        out["limits"].setdefault(cfg.gpu_resource, "1")
        out["requests"][cfg.gpu_resource] = out["limits"][cfg.gpu_resource]
    return {part: q for part, q in out.items() if q}


def assignment_secret_manifest(cfg: PodConfig, spec: WorkerSpec) -> dict[str, Any] | None:
    """The worker's assignment (`assignment_env`: its storage credentials are in it) as a
    Secret of its own, or None for a warm-pool worker (it gets its assignment through Redis)."""
    if spec.assignment is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(spec.worker_id),
            "namespace": cfg.namespace,
            "labels": worker_labels(cfg, spec),
        },
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in assignment_env(spec).items()},
    }


def pod_manifest(cfg: PodConfig, spec: WorkerSpec, env: Mapping[str, str]) -> dict[str, Any]:
    """One worker's pod: `python -m worker` with the local provider's arguments."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": cfg.image,
        "imagePullPolicy": cfg.pull_policy,
        "command": ["python", "-m", "worker"],
        "args": worker_args(spec),
        "env": pod_env(cfg, env),
        "ports": [{"name": "metrics", "containerPort": cfg.metrics_port, "protocol": "TCP"}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.assignment is not None:
        container["envFrom"] = [{"secretRef": {"name": secret_name(spec.worker_id)}}]
    resources = container_resources(cfg, spec.accelerator)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # the reconciler replaces a worker that ended; the kubelet must not restart it
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": cfg.grace_s,
        # workers never talk to the Kubernetes API
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if cfg.service_account:
        pod_spec["serviceAccountName"] = cfg.service_account
    if cfg.node_selectors.get(spec.accelerator):
        pod_spec["nodeSelector"] = dict(cfg.node_selectors[spec.accelerator])
    if cfg.tolerations.get(spec.accelerator):
        pod_spec["tolerations"] = [dict(t) for t in cfg.tolerations[spec.accelerator]]
    volumes, mounts = cache_volumes(cfg, env)
    if volumes:
        pod_spec["volumes"], container["volumeMounts"] = volumes, mounts
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec.worker_id),
            "namespace": cfg.namespace,
            "labels": worker_labels(cfg, spec),
        },
        "spec": pod_spec,
    }


def cache_volumes(
    cfg: PodConfig, env: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the weight cache tiers the workers' env turns on: the node's
    directory when configured (the tier outlives the pod), else an emptyDir (a writable place
    on the image's read-only filesystem; memory-backed and capped for the memory tier).

    ValueError naming the variable when a pod could not be made from it (the provider checks
    at start-up, so no tick fails on it)."""
    volumes, mounts = [], []
    disk_dir = env.get("PLATFORM_LOADER_CACHE_DIR", "")
    if disk_dir:
        _absolute("PLATFORM_LOADER_CACHE_DIR", disk_dir)
        source = _host_dir(cfg.disk_cache_host_path) or {"emptyDir": {}}
        volumes.append({"name": "weights-disk", **source})
        mounts.append({"name": "weights-disk", "mountPath": disk_dir})
    raw = env.get("PLATFORM_LOADER_HOST_CACHE_BYTES") or "0"
    try:
        memory_bytes = int(raw)
    except ValueError:
        raise ValueError(
            f"PLATFORM_LOADER_HOST_CACHE_BYTES {raw!r} is not a whole number of bytes"
        ) from None
    if memory_bytes > 0:
        memory_dir = env.get("PLATFORM_LOADER_HOST_CACHE_DIR") or HOST_CACHE_DIR
        _absolute("PLATFORM_LOADER_HOST_CACHE_DIR", memory_dir)
        source = _host_dir(cfg.memory_cache_host_path) or {
            "emptyDir": {"medium": "Memory", "sizeLimit": str(memory_bytes)}
        }
        volumes.append({"name": "weights-memory", **source})
        mounts.append({"name": "weights-memory", "mountPath": memory_dir})
    return volumes, mounts


def _absolute(name: str, path: str) -> None:
    if not path.startswith("/"):
        raise ValueError(f"{name} {path!r} is not an absolute path")


def _host_dir(path: str) -> dict[str, Any] | None:
    # `Directory`, not `DirectoryOrCreate`: one the kubelet made would be root's, and the
    # worker runs as non-root
    return {"hostPath": {"path": path, "type": "Directory"}} if path else None


def owner_patch(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Makes a Secret the pod's: the garbage collector deletes it once the pod is gone."""
    meta = pod["metadata"]
    ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    return {"metadata": {"ownerReferences": [ref]}}


def exit_code(pod: Mapping[str, Any]) -> int | None:
    """The worker container's exit code once it terminated, else None."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            terminated = (status.get("state") or {}).get("terminated")
            if terminated is not None:
                return int(terminated.get("exitCode", -9))
    return None


class PodTracker:
    """Which worker pods ended, from what LIST and WATCH show (pure: no I/O).

    NOTE: each worker is reported once, whether its end is seen as a terminal phase, a
    DELETED event or its absence from a LIST after a 410 Gone."""

    def __init__(self) -> None:
        self._alive: dict[str, Mapping[str, Any]] = {}  # worker id → its pod, last seen
        self._reported: set[str] = set()  # ended and reported, pod not yet seen gone

    def relist(self, pods: Iterable[Mapping[str, Any]]) -> list[Exited]:
        """Every worker pod that exists now (a LIST): those missing ended while unwatched."""
        pods = list(pods)
        present = {worker_id_of(p) for p in pods} - {None}
        out = []
        for worker_id in sorted(set(self._alive) - present):
            out += self._report(self._alive.pop(worker_id), deleted=True)
        self._reported &= present
        for p in pods:
            out += self.observe("MODIFIED", p)
        return out

    def observe(self, event: str, pod: Mapping[str, Any]) -> list[Exited]:
        """One WATCH event (ADDED, MODIFIED, DELETED) of a worker pod."""
        worker_id = worker_id_of(pod)
        if worker_id is None:
            return []
        if event == "DELETED":
            self._alive.pop(worker_id, None)
            out = self._report(pod, deleted=True)
            self._reported.discard(worker_id)
            return out
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self._alive.pop(worker_id, None)
            return self._report(pod, deleted=False)
        if worker_id not in self._reported:
            self._alive[worker_id] = pod
        return []

    def alive(self) -> set[str]:
        return set(self._alive)

    def _report(self, pod: Mapping[str, Any], deleted: bool) -> list[Exited]:
        worker_id = worker_id_of(pod)
        if worker_id is None or worker_id in self._reported:
            return []
        self._reported.add(worker_id)
        code = exit_code(pod)
        if code is None:
            # gone, or failed (evicted, node lost), with no exit of its own: it was killed
            phase = (pod.get("status") or {}).get("phase")
            code = 0 if phase == "Succeeded" and not deleted else -9
        return [Exited(worker_id, code)]


def worker_id_of(pod: Mapping[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    worker_id = labels.get(WORKER_ID_LABEL)
    return str(worker_id) if worker_id else None

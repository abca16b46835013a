"""Worker pods as Kubernetes objects: the Pod and Secret of each worker, their names and
labels (pure: no I/O, no client). The provider (`provider.py`) creates what these build.

    cfg = pod_config(settings)                       # config.py; ValueError naming the setting
    pod_manifest(cfg, WorkerSpec("wrk_…", "h100", assignment), env)   # a v1 Pod, as a dict

A worker whose engine is vllm (its assignment's, or a vLLM warm-pool worker's) runs the vLLM
image (PLATFORM_KUBERNETES_VLLM_IMAGE); one started for a deployment asks for its assignment's
accelerator_count GPUs on its one pod (vLLM's tensor parallelism). Every other worker runs the
worker image, and every pool worker (of either engine) holds one GPU.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from common.protocol import CREDENTIAL_ENV, HOST_CACHE_DIR, METRICS_HOST_ENV, METRICS_PORT_ENV
from control_plane.providers.base import WorkerSpec
from control_plane.providers.kubernetes.config import LABEL_VALUE, PodConfig, absolute
from control_plane.providers.local import assignment_env, worker_args

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
    if not LABEL_VALUE.fullmatch(spec.worker_id) or len(spec.worker_id) > 63:
        raise ValueError(f"worker id {spec.worker_id!r} is not a label value")
    labels = {
        **selector_labels(cfg.instance),
        WORKER_ID_LABEL: spec.worker_id,
        f"{LABEL_PREFIX}/accelerator": spec.accelerator,
        f"{LABEL_PREFIX}/pool": "true" if spec.assignment is None else "false",
        f"{LABEL_PREFIX}/engine": spec.engine,
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


def container_resources(
    cfg: PodConfig, accelerator: str, accelerator_count: int = 1
) -> dict[str, dict[str, str]]:
    """The type's requests/limits, plus its GPUs unless it is `cpu`: one per worker, or the
    `accelerator_count` of a worker that splits its model over several (vLLM)."""
    own = cfg.resources.get(accelerator, {})
    out = {part: dict(own.get(part, {})) for part in ("requests", "limits")}
    if accelerator != "cpu":
        # an extended resource: requests must equal limits, and the scheduler counts limits
        if accelerator_count > 1:
            out["limits"][cfg.gpu_resource] = str(accelerator_count)
        out["limits"].setdefault(cfg.gpu_resource, "1")
        out["requests"][cfg.gpu_resource] = out["limits"][cfg.gpu_resource]
    return {part: q for part, q in out.items() if q}


def worker_image(cfg: PodConfig, spec: WorkerSpec) -> str:
    """The vLLM image for a worker on vLLM (a vLLM pool worker's too), the worker image
    otherwise. Without a vLLM image (its engine was chosen while the platform had one) the
    worker image: the worker fails to import vLLM and reports why, rather than a tick failing
    here."""
    if spec.engine == "vllm" and cfg.vllm_image:
        return cfg.vllm_image
    return cfg.image


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
        "image": worker_image(cfg, spec),
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
    count = spec.assignment.accelerator_count if spec.assignment is not None else 1
    resources = container_resources(cfg, spec.accelerator, count)
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
    directory when configured (the tier outlives the pod), or for the disk tier a
    PersistentVolumeClaim (shared by the workers that mount it), else an emptyDir (a writable
    place on the image's read-only filesystem; memory-backed and capped for the memory tier).

    ValueError naming the variable when a pod could not be made from it (the provider checks
    at start-up, so no tick fails on it)."""
    volumes, mounts = [], []
    disk_dir = env.get("PLATFORM_LOADER_CACHE_DIR", "")
    if disk_dir:
        absolute("PLATFORM_LOADER_CACHE_DIR", disk_dir)
        claim = cfg.disk_cache_claim
        source = (
            _host_dir(cfg.disk_cache_host_path)
            or ({"persistentVolumeClaim": {"claimName": claim}} if claim else None)
            or {"emptyDir": {}}
        )
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
        absolute("PLATFORM_LOADER_HOST_CACHE_DIR", memory_dir)
        source = _host_dir(cfg.memory_cache_host_path) or {
            "emptyDir": {"medium": "Memory", "sizeLimit": str(memory_bytes)}
        }
        volumes.append({"name": "weights-memory", **source})
        mounts.append({"name": "weights-memory", "mountPath": memory_dir})
    return volumes, mounts


def _host_dir(path: str) -> dict[str, Any] | None:
    # `Directory`, not `DirectoryOrCreate`: one the kubelet made would be root's, and the
    # worker runs as non-root
    return {"hostPath": {"path": path, "type": "Directory"}} if path else None


def owner_patch(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Makes a Secret the pod's: the garbage collector deletes it once the pod is gone."""
    meta = pod["metadata"]
    ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    return {"metadata": {"ownerReferences": [ref]}}

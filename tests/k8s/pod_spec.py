"""What a pod asks of the test kubelet (kubelet.py), read from its spec: whether it fits a node
(nodeSelector, taints and tolerations, extended resources), the command its container runs in
a test image, and its environment (values, Secrets, the pod's own fields).

A pod that cannot boot a worker raises `Unbootable`; the kubelet records it in `problems`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Image:
    python: str  # the interpreter the image's `python` is
    workdir: Path  # where the container starts
    # the image's own environment (Dockerfile ENV), under the pod's
    env: dict[str, str] = field(default_factory=dict)
    # replaces `-m worker` (a stub worker image for tests that need no real one)
    module: str | None = None


class Unbootable(Exception):
    pass


def fits(
    spec: dict[str, Any],
    labels: dict[str, str],
    taints: list[dict[str, str]],
    capacity: dict[str, int],
) -> bool:
    """The pod may run on a node with these labels, taints and extended resources."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = spec.get("tolerations") or []
    for taint in taints:
        if not any(tolerates(t, taint) for t in tolerations):
            return False
    for c in spec["containers"]:
        for resource, qty in ((c.get("resources") or {}).get("limits") or {}).items():
            if "/" in resource and int(qty) > capacity.get(resource, 0):
                return False
    return True


def tolerates(toleration: dict[str, Any], taint: dict[str, str]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value") == taint.get("value")


def container_argv(
    spec: dict[str, Any], c: dict[str, Any], images: dict[str, Image]
) -> tuple[Image, list[str]]:
    """The image a worker container runs in and its command line there."""
    if spec.get("restartPolicy") != "Never":
        raise Unbootable(f"restartPolicy {spec.get('restartPolicy')} (a worker: Never)")
    image = images.get(c["image"])
    if image is None:
        raise Unbootable(f"ErrImagePull: no image {c['image']!r} on this node")
    argv = [*c.get("command", []), *c.get("args", [])]
    if argv[:1] != ["python"]:
        raise Unbootable(f"command {argv[:3]} is not the image's python")
    if image.module is not None:
        if argv[1:3] != ["-m", "worker"]:
            raise Unbootable(f"{argv[:3]}: not a worker")
        argv = [image.python, "-m", image.module, *argv[3:]]
    else:
        argv = [image.python, *argv[1:]]
    return image, argv


def container_env(
    c: dict[str, Any], secret: Callable[[str], dict[str, str]], fields: dict[str, str]
) -> dict[str, str]:
    """The container's environment: values, Secrets (`secret(name)` reads one) and the pod's
    `fields` (fieldRef paths)."""
    env: dict[str, str] = {}
    for source in c.get("envFrom") or []:
        ref = source.get("secretRef")
        if ref is None:
            raise Unbootable(f"envFrom {source}: only secretRef here")
        prefix = source.get("prefix", "")
        for k, v in secret(ref["name"]).items():
            env[prefix + k] = v
    for var in c.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif ref := (var.get("valueFrom") or {}).get("secretKeyRef"):
            data = secret(ref["name"])
            if ref["key"] not in data:
                raise Unbootable(f"secret {ref['name']!r} has no key {ref['key']!r}")
            env[var["name"]] = data[ref["key"]]
        elif ref := (var.get("valueFrom") or {}).get("fieldRef"):
            if ref["fieldPath"] not in fields:
                raise Unbootable(f"fieldRef {ref['fieldPath']} unsupported")
            env[var["name"]] = fields[ref["fieldPath"]]
        else:
            raise Unbootable(f"env {var['name']}: no value")
    return env

"""Render infra/helm/platform offline, as `helm template` would, for the tests of this folder.

The renderer is Helm itself: helm-python-sdk binds Helm's official Go SDK (its wheel bundles the
library, so no helm binary, no network). `lookup` returns nothing offline, as in `helm template`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
CHART = INFRA / "helm" / "platform"
RELEASE = "platform"
NAMESPACE = "llm"

# Value sets rendered by the tests: the defaults, and the variations an operator picks among.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-stores": {
        "redis": {"enabled": False, "external": {"url": "redis://redis.example:6379/0"}},
        "postgresql": {"external": {"existingSecret": "pg", "existingSecretKey": "dsn"}},
        "s3": {"endpointUrl": "https://s3.example", "existingSecret": "s3-creds"},
    },
    "redis-url-in-secret": {
        "redis": {"enabled": False, "external": {"existingSecret": "redis-creds"}},
    },
    "trial-stores": {
        "postgresql": {"enabled": True},
        "secrets": {"bootstrapAdminKey": "pk_0123456789ab_secret"},
    },
    "monitoring-and-policies": {
        "secrets": {"generateAdminKey": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "networkPolicy": {"apiIngressFrom": [{"namespaceSelector": {}}]},
        "api": {"autoscaling": {"enabled": False}, "replicas": 3, "processesPerPod": 2},
        "reconciler": {"replicas": 3},
        "workers": {
            "namespace": "llm-workers",
            "warmPoolMax": 2,
            "loaderCacheDir": "/cache",
            "hostCacheBytes": 17179869184,
            "diskCacheHostPath": "/var/cache/platform-weights",
            "memoryCacheHostPath": "/dev/shm/platform-weights",
        },
        "extraEnv": {"PLATFORM_DEFAULT_REQUESTS_PER_MIN": "1200"},
    },
    "existing-secret": {"secrets": {"existingSecret": "platform-own"}},
    "ingress-and-worker-policy": {
        "api": {
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "host": "llm.example.com",
                "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
                "tls": {"secretName": "llm-example-tls"},
            }
        },
        "networkPolicy": {
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
            ],
            "workers": {"enabled": True},
        },
        "workers": {"namespace": "llm-workers"},
    },
}


@dataclass(frozen=True, slots=True)
class Rendered:
    template: str  # chart-relative template path, e.g. "platform/templates/api.yaml"
    text: str  # the rendered YAML of that template (several documents)
    objects: list[dict[str, Any]]  # its non-empty documents, parsed


def render(values: dict[str, Any] | None = None, *, is_upgrade: bool = False) -> list[Rendered]:
    """The chart's manifests for these values (NOTES.txt left out)."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(
            values or {},
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=not is_upgrade,
            is_upgrade=is_upgrade,
        )
    result = []
    for template, text in sorted(out.items()):
        if not template.endswith((".yaml", ".yml")):
            continue
        docs = [d for d in yaml.safe_load_all(text) if d]
        result.append(Rendered(template, text, docs))
    return result


def objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [o for r in render(values) for o in r.objects]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def containers(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container of a workload (Deployment, StatefulSet, Job)."""
    spec = obj["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}

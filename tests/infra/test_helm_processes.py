"""The chart's reconciler and Celery metrics ports (served, probed, scraped, fenced), the API's
Ingress and the worker pods' NetworkPolicy: each value on and off, rendered by Helm; the
objects' schemas are checked for every variant in test_helm_chart.py."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from control_plane.providers.kubernetes.pods import selector_labels
from control_plane.settings import Settings
from tests.infra.chart import NAMESPACE, RELEASE, VARIANTS, containers, env_of, find, objects

PROCESSES = {"reconciler": 9410, "celery": 9411}


@pytest.mark.parametrize(("component", "port"), sorted(PROCESSES.items()))
def test_each_process_serves_metrics_and_is_probed_there(component: str, port: int) -> None:
    deployment = find(objects(), "Deployment", f"{RELEASE}-{component}")
    (c,) = containers(deployment)
    (served,) = c["ports"]
    assert served == {"name": "metrics", "containerPort": port, "protocol": "TCP"}
    env = {name: e["value"] for name, e in env_of(c).items() if "value" in e}
    # the settings the process reads (control_plane/metrics/server.py binds them)
    settings = Settings(
        metrics_host=env["PLATFORM_METRICS_HOST"], metrics_port=env["PLATFORM_METRICS_PORT"]
    )
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", port)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    # a liveness probe slower to give up than readiness: a slow scrape is not a restart
    live, ready = c["livenessProbe"], c["readinessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > (
        ready["periodSeconds"] * ready["failureThreshold"]
    )


def test_the_port_follows_the_values() -> None:
    objs = objects({"reconciler": {"metricsPort": 9500}})
    (c,) = containers(find(objs, "Deployment", f"{RELEASE}-reconciler"))
    assert c["ports"][0]["containerPort"] == 9500
    assert env_of(c)["PLATFORM_METRICS_PORT"]["value"] == "9500"


def test_pod_monitor_scrapes_both_processes_only_when_asked() -> None:
    assert not [o for o in objects() if o["kind"] == "PodMonitor"]
    objs = objects(VARIANTS["monitoring-and-policies"])
    pm = find(objs, "PodMonitor", f"{RELEASE}-processes")
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s"}
    selector = pm["spec"]["selector"]
    (expr,) = selector["matchExpressions"]
    selected = set()
    for d in (o for o in objs if o["kind"] in ("Deployment", "StatefulSet")):
        labels = d["spec"]["template"]["metadata"]["labels"]
        if selector["matchLabels"].items() <= labels.items() and labels.get(expr["key"]) in set(
            expr["values"]
        ):
            assert expr["operator"] == "In"
            selected.add(d["metadata"]["name"])
            assert "metrics" in {p["name"] for c in containers(d) for p in c.get("ports", [])}
    assert selected == {f"{RELEASE}-reconciler", f"{RELEASE}-celery"}


def test_a_pod_monitor_for_worker_pods_selects_what_the_provider_labels() -> None:
    """Off by default (the workers are found by HTTP service discovery); asked for, it lives in
    the workers' namespace and selects the labels every worker pod of the release carries."""
    values = VARIANTS["monitoring-and-policies"]
    assert not [o for o in objects(values) if o["metadata"]["name"] == f"{RELEASE}-workers"]
    objs = objects({**values, "serviceMonitor": {**values["serviceMonitor"], "workerPods": True}})
    pm = find(objs, "PodMonitor", f"{RELEASE}-workers")
    assert pm["metadata"]["namespace"] == "llm-workers"
    assert pm["spec"]["selector"]["matchLabels"].items() <= selector_labels(RELEASE).items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"  # the worker container's port (pods.py)
    assert "platform-serverless.io/worker-id" in pm["spec"]["podTargetLabels"]


def _policy(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return find(objs, "NetworkPolicy", f"{RELEASE}-{name}")["spec"]


@pytest.mark.parametrize("component", sorted(PROCESSES))
def test_processes_admit_only_the_scrape(component: str) -> None:
    (rule,) = _policy(objects(), component)["ingress"]
    assert rule == {"ports": [{"port": "metrics", "protocol": "TCP"}]}  # from any peer
    (rule,) = _policy(objects(VARIANTS["ingress-and-worker-policy"]), component)["ingress"]
    mon = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    assert rule["from"] == [mon]
    assert _policy(objects(), component)["policyTypes"] == ["Ingress"]


def test_ingress_is_off_by_default_and_terminates_tls() -> None:
    assert not [o for o in objects() if o["kind"] == "Ingress"]
    objs = objects(VARIANTS["ingress-and-worker-policy"])
    ingress = find(objs, "Ingress", f"{RELEASE}-api")
    assert ingress["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt"}
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["llm.example.com"], "secretName": "llm-example-tls"}]
    (rule,) = spec["rules"]
    assert rule["host"] == "llm.example.com"
    (path,) = rule["http"]["paths"]
    svc = find(objs, "Service", f"{RELEASE}-api")
    assert path["backend"]["service"]["name"] == svc["metadata"]["name"]
    assert path["backend"]["service"]["port"]["name"] in {p["name"] for p in svc["spec"]["ports"]}


def test_ingress_without_a_tls_secret_is_plain_http() -> None:
    objs = objects({"api": {"ingress": {"enabled": True, "host": "llm.example.com"}}})
    spec = find(objs, "Ingress", f"{RELEASE}-api")["spec"]
    assert "tls" not in spec and "ingressClassName" not in spec


def test_ingress_needs_a_host() -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmError, match=r"api\.ingress\.host is required"):
        objects({"api": {"ingress": {"enabled": True}}})


def _worker_pod(namespace: str) -> dict[str, Any]:
    """The labels the Kubernetes provider gives a worker pod of this release."""
    return {"namespace": namespace, "labels": selector_labels(RELEASE)}


def _selects(peer: dict[str, Any], namespace: str, labels: dict[str, str]) -> bool:
    ns = peer.get("namespaceSelector", {}).get("matchLabels")
    ns_ok = ns == {"kubernetes.io/metadata.name": namespace} if ns is not None else True
    pods = peer.get("podSelector", {}).get("matchLabels", {})
    return ns_ok and pods.items() <= labels.items()


def test_worker_policy_is_off_by_default() -> None:
    names = {o["metadata"]["name"] for o in objects() if o["kind"] == "NetworkPolicy"}
    assert f"{RELEASE}-workers" not in names


def test_worker_pods_reach_only_dns_the_api_redis_and_storage() -> None:
    objs = objects(VARIANTS["ingress-and-worker-policy"])
    policy = find(objs, "NetworkPolicy", f"{RELEASE}-workers")
    kubernetes_validate.validate(policy, "1.33", strict=True)
    pod = _worker_pod("llm-workers")
    assert policy["metadata"]["namespace"] == pod["namespace"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= pod["labels"].items()
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # ingress: the scrape of the worker's metrics port, from the scraper only
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 9400, "protocol": "TCP"}]
    assert [p["namespaceSelector"] for p in rule["from"]] == [
        {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}
    ]
    # egress: each rule's peers are the platform's own pods (by their labels), or storage
    dns, api, redis, storage = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53} and "to" not in dns
    for rule, component, port in ((api, "api", 8000), (redis, "redis", 6379)):
        target = find(
            objs,
            "Deployment" if component == "api" else "StatefulSet",
            f"{RELEASE}-{component}",
        )
        labels = target["spec"]["template"]["metadata"]["labels"]
        (peer,) = rule["to"]
        assert _selects(peer, NAMESPACE, labels), component
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        container_ports = {p["containerPort"] for c in containers(target) for p in c["ports"]}
        assert port in container_ports, component
    assert storage == {"ports": [{"port": 443, "protocol": "TCP"}]}


def test_worker_policy_follows_the_stores_and_extra_rules() -> None:
    collector = {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 4317}]}
    values = {
        "networkPolicy": {"workers": {"enabled": True, "extraEgress": [collector]}},
        "redis": {"enabled": False, "external": {"url": "redis://redis.example:6379/0"}},
    }
    spec = find(objects(values), "NetworkPolicy", f"{RELEASE}-workers")["spec"]
    assert spec["egress"][-1] == collector
    # no chart Redis: no rule for it (yours goes in extraEgress)
    assert not [r for r in spec["egress"] if any(p["port"] == 6379 for p in r["ports"])]
    # no metricsFrom: the metrics port from any peer
    assert "from" not in spec["ingress"][0]


def test_stores_admit_workers_from_their_own_namespace() -> None:
    objs = objects(VARIANTS["ingress-and-worker-policy"])
    pod = _worker_pod("llm-workers")
    (rule,) = _policy(objs, "redis")["ingress"]
    assert any(_selects(p, pod["namespace"], pod["labels"]) for p in rule["from"])
    # without a namespace of their own, the release's pods' peer covers them
    (rule,) = _policy(objects(), "redis")["ingress"]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": RELEASE}}}
    ]


def test_a_vllm_image_makes_a_platform_with_vllm_for_the_api_and_the_reconciler() -> None:
    """workers.vllmImage reaches every control-plane process (the API decides engines by it,
    the reconciler starts vLLM workers' pods with it); without it the platform has no vLLM."""
    image = "registry.example.com/platform-worker-vllm:0.1.0"
    for values, expected in (({}, None), ({"workers": {"vllmImage": image}}, image)):
        config = find(objects(values), "ConfigMap", f"{RELEASE}-env")["data"]
        assert config.get("PLATFORM_KUBERNETES_VLLM_IMAGE") == expected
        settings = Settings(provider="kubernetes", kubernetes_vllm_image=expected or "")
        assert settings.has_vllm() == (expected is not None)

"""The Helm chart: lint, render with several value sets, validate every object against the
Kubernetes schemas (strict: an unknown or misspelt field fails), and check the behaviour the
platform relies on (probes, the reconciler's lease and identity, RBAC, stores, the migration)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from control_plane.providers.kubernetes import REQUIRED_ACCESS
from tests.infra.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    VARIANTS,
    containers,
    env_of,
    find,
    objects,
    render,
)

# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest the validator
# ships schemas for: a field removed or added in between fails one of them.
OLDEST, NEWEST = "1.27.0", kubernetes_validate.latest_version()
# Custom resources: no schema in kubernetes-validate; checked by hand below.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}


def test_lint_has_no_errors() -> None:
    import helm_python as helm

    result = helm.lint(str(CHART))
    assert result["errors"] == []
    # severity 1 is INFO (e.g. "icon is recommended"); warnings and errors fail
    assert [m for m in result["messages"] if m["severity"] > 1] == []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_every_object_is_valid_kubernetes(variant: str, version: str) -> None:
    objs = objects(VARIANTS[variant])
    assert objs
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            pytest.fail(f"{variant}: {name} is invalid for {version}: {exc.message} at {exc.path}")


def test_validation_catches_a_misspelt_field() -> None:
    """The strict validation above is not vacuous: one unknown field fails it."""
    api = find(objects(), "Deployment", f"{RELEASE}-api")
    api["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, NEWEST, strict=True)


def test_names_are_unique_per_kind() -> None:
    for variant, values in VARIANTS.items():
        keys = [(o["kind"], o["metadata"]["name"]) for o in objects(values)]
        assert len(keys) == len(set(keys)), variant


def test_api_probes_service_hpa_and_pdb() -> None:
    objs = objects()
    api = find(objs, "Deployment", f"{RELEASE}-api")
    (c,) = containers(api)
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["ports"][0]["containerPort"] == 8000
    # The HPA owns the replica count; a fixed one would fight it on every upgrade.
    assert "replicas" not in api["spec"]
    hpa = find(objs, "HorizontalPodAutoscaler", f"{RELEASE}-api")
    assert hpa["spec"]["scaleTargetRef"]["name"] == api["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    pdb = find(objs, "PodDisruptionBudget", f"{RELEASE}-api")
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc = find(objs, "Service", f"{RELEASE}-api")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]


def test_without_hpa_the_replica_count_is_the_values() -> None:
    objs = objects(VARIANTS["monitoring-and-policies"])
    assert find(objs, "Deployment", f"{RELEASE}-api")["spec"]["replicas"] == 3
    assert not [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]


def test_reconciler_is_leader_elected_and_named_by_its_pod() -> None:
    objs = objects({"reconciler": {"replicas": 1}})
    rec = find(objs, "Deployment", f"{RELEASE}-reconciler")
    # one replica asked: still two, or a dead leader has nobody to take the lease over
    assert rec["spec"]["replicas"] >= 2
    (c,) = containers(rec)
    env = env_of(c)
    assert env["PLATFORM_PROVIDER"]["value"] == "kubernetes"
    assert env["PLATFORM_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PLATFORM_KUBERNETES_NAMESPACE"]["value"] == NAMESPACE
    sa = rec["spec"]["template"]["spec"]["serviceAccountName"]
    assert find(objs, "ServiceAccount", sa)
    config = find(objs, "ConfigMap", f"{RELEASE}-env")["data"]
    assert float(config["PLATFORM_RECONCILER_LEASE_S"]) == 10


def _reconciler_env(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    rec = find(objects(values), "Deployment", f"{RELEASE}-reconciler")
    return env_of(next(containers(rec)))


def test_worker_pod_settings_reach_the_reconciler() -> None:
    env = _reconciler_env()
    value = {name: e.get("value") for name, e in env.items()}
    assert value["PLATFORM_KUBERNETES_WORKER_IMAGE"] == "platform-worker:0.1.0"
    assert json.loads(value["PLATFORM_KUBERNETES_NODE_SELECTORS"]) == {
        "h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    }
    (toleration,) = json.loads(value["PLATFORM_KUBERNETES_TOLERATIONS"])["h100"]
    assert toleration["key"] == "nvidia.com/gpu"
    resources = json.loads(value["PLATFORM_KUBERNETES_WORKER_RESOURCES"])["h100"]
    assert resources["limits"]["memory"] == "200Gi"
    assert value["PLATFORM_KUBERNETES_WORKER_METRICS_PORT"] == "9400"
    # worker pods carry the release as their instance label: NetworkPolicy admits them
    assert value["PLATFORM_KUBERNETES_INSTANCE"] == RELEASE
    config = find(objects(), "ConfigMap", f"{RELEASE}-env")["data"]
    assert json.loads(config["PLATFORM_ACCELERATORS"]) == {"h100": 8}


def test_the_provider_settings_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconciler's environment, as rendered, builds a valid Settings (JSON maps included)."""
    from control_plane.settings import Settings

    config = find(objects(), "ConfigMap", f"{RELEASE}-env")["data"]
    plain = {name: e["value"] for name, e in _reconciler_env().items() if "value" in e}
    for name, value in {**config, **plain}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PLATFORM_WORKER_TOKEN", "x" * 40)  # from a Secret in a pod
    settings = Settings()
    assert settings.provider == "kubernetes"
    assert settings.kubernetes_tolerations["h100"][0]["operator"] == "Exists"
    assert settings.kubernetes_node_selectors == {
        "h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    }
    assert settings.accelerators == {"h100": 8}
    assert settings.kubernetes_namespace == NAMESPACE


def test_cache_tiers_from_the_values_reach_the_worker_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Values → the reconciler's environment → Settings → the pod the provider would create:
    the node directories behind both cache tiers, mounted where the workers look."""
    from control_plane.providers.base import WorkerSpec
    from control_plane.providers.kubernetes.config import pod_config
    from control_plane.providers.kubernetes.pods import pod_manifest
    from control_plane.settings import Settings

    values = VARIANTS["monitoring-and-policies"]
    config = find(objects(values), "ConfigMap", f"{RELEASE}-env")["data"]
    plain = {name: e["value"] for name, e in _reconciler_env(values).items() if "value" in e}
    env = {**config, **plain, "PLATFORM_WORKER_TOKEN": "x" * 40}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pod = pod_manifest(pod_config(Settings()), WorkerSpec("wrk_1", "h100", None), env)
    kubernetes_validate.validate(pod, "1.33", strict=True)
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    assert paths == {
        "weights-disk": "/var/cache/platform-weights",
        "weights-memory": "/dev/shm/platform-weights",
    }
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["weights-disk"] == "/cache"
    # the disk tier on a claim instead
    claimed = {**values, "workers": {**values["workers"], "diskCacheHostPath": "",
                                     "diskCacheClaim": "platform-weights"}}  # fmt: skip
    plain = {name: e["value"] for name, e in _reconciler_env(claimed).items() if "value" in e}
    assert plain["PLATFORM_KUBERNETES_DISK_CACHE_CLAIM"] == "platform-weights"
    assert "PLATFORM_KUBERNETES_DISK_CACHE_HOST_PATH" not in plain


def test_worker_token_secret_lives_with_the_workers() -> None:
    env = _reconciler_env()
    assert env["PLATFORM_KUBERNETES_WORKER_TOKEN_SECRET"]["value"] == f"{RELEASE}-secrets"
    assert env["PLATFORM_KUBERNETES_WORKER_TOKEN_SECRET_KEY"]["value"] == "PLATFORM_WORKER_TOKEN"
    # another namespace: the chart copies the generated token there, the same value
    objs = objects(VARIANTS["monitoring-and-policies"])
    own = find(objs, "Secret", f"{RELEASE}-secrets")
    copy = find(objs, "Secret", f"{RELEASE}-worker-token")
    assert copy["metadata"]["namespace"] == "llm-workers"
    assert copy["data"]["PLATFORM_WORKER_TOKEN"] == own["data"]["PLATFORM_WORKER_TOKEN"]


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_grants_what_the_provider_needs_and_no_more() -> None:
    objs = objects(VARIANTS["monitoring-and-policies"])
    role = find(objs, "Role", f"{RELEASE}-reconciler")
    # worker pods go to their own namespace; the Role and its binding live there
    assert role["metadata"]["namespace"] == "llm-workers"
    # exactly what the provider checks for at start (SelfSubjectAccessReviews)
    assert _rules(role) == {(g, r): set(verbs) for g, r, verbs in REQUIRED_ACCESS}
    binding = find(objs, "RoleBinding", f"{RELEASE}-reconciler")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == NAMESPACE
    review = find(objs, "ClusterRole", f"{RELEASE}-{NAMESPACE}-access-review")
    assert _rules(review) == {("authorization.k8s.io", "selfsubjectaccessreviews"): {"create"}}
    # the API's own account reads worker pods' logs (GET /v1/logs), and nothing else
    api = find(objs, "Deployment", f"{RELEASE}-api")["spec"]["template"]["spec"]
    assert api["serviceAccountName"] == f"{RELEASE}-api"
    assert find(objs, "ServiceAccount", f"{RELEASE}-api")
    logs = find(objs, "Role", f"{RELEASE}-api-logs")
    assert logs["metadata"]["namespace"] == "llm-workers"
    assert _rules(logs) == {("", "pods/log"): {"get"}}
    logs_binding = find(objs, "RoleBinding", f"{RELEASE}-api-logs")
    assert logs_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-api", "namespace": NAMESPACE}
    ]
    (c,) = containers(find(objs, "Deployment", f"{RELEASE}-api"))
    assert env_of(c)["PLATFORM_KUBERNETES_NAMESPACE"]["value"] == "llm-workers"


def test_only_the_reconciler_and_the_api_talk_to_the_kubernetes_api() -> None:
    """The reconciler (pods, Secrets, its Lease) and the API (pods' logs, its own account);
    nothing else mounts a token."""
    talking = {f"{RELEASE}-reconciler", f"{RELEASE}-api"}
    for obj in objects(VARIANTS["trial-stores"]):
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            spec = obj["spec"]["template"]["spec"]
            talks = obj["metadata"]["name"] in talking
            assert spec.get("automountServiceAccountToken", True) is talks, obj["metadata"]


def test_redis_statefulset_keeps_an_aof_on_a_pvc() -> None:
    objs = objects()
    redis = find(objs, "StatefulSet", f"{RELEASE}-redis")
    args = next(containers(redis))["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    claim = redis["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"
    config = find(objs, "ConfigMap", f"{RELEASE}-env")["data"]
    assert config["PLATFORM_REDIS_URL"] == f"redis://{RELEASE}-redis:6379/0"


def test_external_stores_replace_the_statefulsets() -> None:
    objs = objects(VARIANTS["external-stores"])
    assert not [o for o in objs if o["kind"] == "StatefulSet"]
    config = find(objs, "ConfigMap", f"{RELEASE}-env")["data"]
    assert config["PLATFORM_REDIS_URL"] == "redis://redis.example:6379/0"
    assert config["PLATFORM_S3_ENDPOINT_URL"] == "https://s3.example"
    api = env_of(next(containers(find(objs, "Deployment", f"{RELEASE}-api"))))
    assert api["PLATFORM_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pg", "key": "dsn"}
    assert api["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds"


def test_redis_url_from_a_secret() -> None:
    objs = objects(VARIANTS["redis-url-in-secret"])
    assert "PLATFORM_REDIS_URL" not in find(objs, "ConfigMap", f"{RELEASE}-env")["data"]
    api = env_of(next(containers(find(objs, "Deployment", f"{RELEASE}-api"))))
    ref = api["PLATFORM_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "redis-creds", "key": "redis-url"}


@pytest.mark.parametrize(
    "values",
    [
        {"redis": {"enabled": False}},  # neither a URL nor a Secret for it
        {"postgresql": {"external": {"existingSecret": ""}}},  # no database at all
        {"s3": {"existingSecret": ""}},  # no storage credentials
    ],
)
def test_a_missing_store_is_refused_at_render(values: dict[str, Any]) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmError, match="required"):
        render(values)


def test_trial_postgresql_and_its_migration_order() -> None:
    objs = objects(VARIANTS["trial-stores"])
    pg = find(objs, "StatefulSet", f"{RELEASE}-postgresql")
    assert pg["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    job = find(objs, "Job", f"{RELEASE}-migrate")
    # the database is one of the release's objects: migrate after install, before upgrades
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    env = env_of(next(containers(job)))
    ref = env["PLATFORM_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{RELEASE}-postgresql", "key": "database-url"}
    # its admin key comes from a hook Secret created before it
    key_ref = env["BOOTSTRAP_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    secret = find(objs, "Secret", key_ref["name"])
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )


def test_migration_job_is_a_pre_install_and_pre_upgrade_hook() -> None:
    job = find(objects(), "Job", f"{RELEASE}-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (c,) = containers(job)
    assert c["args"] == ["migrate"]
    # a hook runs before the release's ConfigMap and Secret exist: it may not need them
    assert "envFrom" not in c
    for e in c["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref and not ref.get("optional"):
            assert ref["name"] == "platform-database", e


def test_service_monitor_is_off_by_default_and_scrapes_the_api() -> None:
    assert not [o for o in objects() if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    objs = objects(VARIANTS["monitoring-and-policies"])
    (sm,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    svc = find(objs, "Service", f"{RELEASE}-api")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"]["key"]


def test_network_policies_select_real_pods_and_ports() -> None:
    objs = objects(VARIANTS["trial-stores"])
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {
        f"{RELEASE}-api",
        f"{RELEASE}-redis",
        f"{RELEASE}-postgresql",
        f"{RELEASE}-reconciler",
        f"{RELEASE}-celery",
    }
    workloads = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    for policy in policies:
        selector = policy["spec"]["podSelector"]["matchLabels"]
        (target,) = [
            w
            for w in workloads
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        port_names = {p["name"] for c in containers(target) for p in c.get("ports", [])}
        for rule in policy["spec"]["ingress"]:
            assert {p["port"] for p in rule["ports"]} <= port_names


def test_pods_run_as_non_root() -> None:
    for obj in objects(VARIANTS["trial-stores"]):
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            pod = obj["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
            assert pod["securityContext"]["runAsUser"] != 0
            for c in containers(obj):
                assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_generated_secrets_are_long_enough() -> None:
    import base64

    secret = find(objects(), "Secret", f"{RELEASE}-secrets")
    token = base64.b64decode(secret["data"]["PLATFORM_WORKER_TOKEN"]).decode()
    assert len(token) >= 16  # Settings refuses a shorter worker token
    own = objects(VARIANTS["existing-secret"])
    assert not [o for o in own if o["kind"] == "Secret"]
    api = env_of(next(containers(find(own, "Deployment", f"{RELEASE}-api"))))
    assert api["PLATFORM_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "platform-own"

"""The cluster's API as the provider reaches it: the client from the settings, the checks made
at start-up (RBAC, the worker-token Secret), and the keyword arguments and answers of one call.

Every call asks for raw JSON (`call()`): no model deserialisation, the pods and Secrets travel
as the dicts `pods.py` builds. Errors: `api_client` and `check_token_secret` raise ValueError
naming the setting; the rest raise the client's ApiException.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from control_plane.providers.kubernetes.config import PodConfig
from control_plane.settings import Settings

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

# What the control plane does through the API (pods, their logs for `GET /v1/logs`, their
# Secrets, the reconciler's Lease): checked at start-up, so a missing Role rule is one clear
# error, not a failing tick. A subresource is written `resource/subresource`.
REQUIRED_ACCESS = (
    ("", "pods", ("create", "get", "list", "watch", "delete")),
    ("", "pods/log", ("get",)),
    ("", "secrets", ("create", "get", "patch", "delete")),
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
)
REQUEST_TIMEOUT_S = 10.0  # one non-watch call


def api_client(settings: Settings) -> ApiClient:
    """A client of the cluster's API: the kubeconfig file of PLATFORM_KUBERNETES_KUBECONFIG,
    else the pod's own service account (in-cluster)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if settings.kubernetes_kubeconfig:
            config.load_kube_config(
                config_file=settings.kubernetes_kubeconfig,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        where = settings.kubernetes_kubeconfig or "the in-cluster service account"
        raise ValueError(
            f"PLATFORM_KUBERNETES_KUBECONFIG: no Kubernetes API configuration from {where}: {exc}"
        ) from None
    return client.ApiClient(configuration)


def denied_access(authorization: Any, namespace: str) -> list[str]:
    """What of REQUIRED_ACCESS this identity may not do in `namespace` ("create pods", …),
    asked with SelfSubjectAccessReviews. `authorization`: an AuthorizationV1Api."""
    denied = []
    for group, name, verbs in REQUIRED_ACCESS:
        resource, _, subresource = name.partition("/")
        for verb in verbs:
            attributes = {"namespace": namespace, "group": group, "resource": resource}
            if subresource:
                attributes["subresource"] = subresource
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {**attributes, "verb": verb}},
            }
            answer = as_json(
                authorization.create_self_subject_access_review(
                    review, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                )
            )
            if not (answer.get("status") or {}).get("allowed"):
                denied.append(f"{verb} {name}")
    return denied


def check_token_secret(core: Any, cfg: PodConfig) -> None:
    """ValueError naming the setting unless the workers' token Secret exists with its key.
    `core`: a CoreV1Api."""
    from kubernetes.client.rest import ApiException

    try:
        secret = as_json(core.read_namespaced_secret(cfg.token_secret, cfg.namespace, **call()))
    except ApiException as exc:
        if exc.status != 404:
            raise
        raise ValueError(
            f"PLATFORM_KUBERNETES_WORKER_TOKEN_SECRET: no Secret {cfg.token_secret!r} in namespace "
            f"{cfg.namespace!r} (it holds the workers' PLATFORM_WORKER_TOKEN)"
        ) from None
    if cfg.token_key not in (secret.get("data") or {}):
        raise ValueError(
            f"PLATFORM_KUBERNETES_WORKER_TOKEN_SECRET_KEY: Secret {cfg.token_secret!r} has no key "
            f"{cfg.token_key!r}"
        )


def call() -> dict[str, Any]:
    """Keyword arguments of one non-watch call: raw JSON back (no model deserialisation)."""
    return {"_preload_content": False, "_request_timeout": REQUEST_TIMEOUT_S}


def merge_patch() -> dict[str, Any]:
    """A PATCH's keyword arguments: a JSON merge patch (RFC 7386), whose meaning needs no
    knowledge of the kind's strategic-merge keys (the client's default for a dict)."""
    return {**call(), "_content_type": "application/merge-patch+json"}


def as_json(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data or b"{}")
    return data


def reason(exc: Exception) -> str:
    """An ApiException (or any error) in one line: status, reason and the API's message."""
    status, why = getattr(exc, "status", None), getattr(exc, "reason", None)
    try:
        message = json.loads(getattr(exc, "body", None) or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return " ".join(str(x) for x in (status, why, message) if x) or str(exc)

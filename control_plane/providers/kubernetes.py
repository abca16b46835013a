"""Kubernetes provider: one pod per worker, through the official client.

    start(spec)   Secret <pod>-assignment  its assignment, storage credentials included
                  Pod <pod>                `python -m worker …`, restartPolicy Never, the worker
                                           token by secretKeyRef, the assignment by envFrom
                  Secret ← ownerReferences [the pod]: the garbage collector deletes it with it
    stop / kill   DELETE the pod, grace = terminationGracePeriodSeconds (the worker drains on
                  SIGTERM) / 0
    watch thread  LIST pods by label selector → WATCH from its resourceVersion; 410 Gone → LIST
                  again. Pods that ended (Succeeded, Failed, deleted) go to a queue `reap` drains.
    reap          the leader's only: deletes what an ended pod left (the pod, its Secret)

Pods are found by their labels, never by this process's memory: a new leader replica sees the
pods an earlier one created. The pure part (manifests from settings + WorkerSpec, and which pods
ended: `PodTracker`) does no I/O; `KubernetesProvider` is the thin adapter.

Errors: `from_settings` raises ValueError naming the setting (image, accelerator types, RBAC,
the worker-token Secret); `start` raises the client's ApiException on what the API refuses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from control_plane.providers.base import Exited, WorkerSpec
from control_plane.providers.pods import (
    PodConfig,
    PodTracker,
    assignment_secret_manifest,
    cache_volumes,
    label_selector,
    owner_patch,
    pod_config,
    pod_manifest,
    pod_name,
    secret_name,
    worker_id_of,
)
from control_plane.settings import Settings

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

# What the control plane does through the API (pods, their Secrets, the reconciler's Lease):
# checked at start-up, so a missing Role rule is one clear error, not a failing tick.
REQUIRED_ACCESS = (
    ("", "pods", ("create", "get", "list", "watch", "delete")),
    ("", "secrets", ("create", "get", "patch", "delete")),
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
)
WATCH_TIMEOUT_S = 240  # the server ends a watch after this; it resumes from its resourceVersion
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
    for group, resource, verbs in REQUIRED_ACCESS:
        for verb in verbs:
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "namespace": namespace,
                        "group": group,
                        "resource": resource,
                        "verb": verb,
                    }
                },
            }
            answer = _json(
                authorization.create_self_subject_access_review(
                    review, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                )
            )
            if not (answer.get("status") or {}).get("allowed"):
                denied.append(f"{verb} {resource}")
    return denied


@dataclass(frozen=True, slots=True)
class _End:
    exited: Exited
    delete_pod: bool  # it ended by itself: its pod stays until deleted


class KubernetesProvider:
    """Workers as pods. Example (the reconciler's, through `select.make_provider`):

    provider = KubernetesProvider.from_settings(settings, workers_env(settings, os.environ))
    provider.start(WorkerSpec("wrk_…", "h100", assignment))   # None: no pid
    provider.reap()                                            # [Exited("wrk_…", 0)]
    """

    def __init__(self, api: ApiClient, cfg: PodConfig, env: Mapping[str, str]) -> None:
        from kubernetes import client

        self._api = api
        self._core = client.CoreV1Api(api)
        self._cfg = cfg
        self._env = dict(env)
        self._selector = label_selector(cfg.instance)
        self._exited: queue.SimpleQueue[_End] = queue.SimpleQueue()
        self._tracker = PodTracker()
        self._closed = threading.Event()
        self._synced = threading.Event()  # the first LIST is done
        self._response: Any = None  # the watch's HTTP response, closed by `close`
        self._thread = threading.Thread(target=self._watch_loop, name="pod-watch", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, settings: Settings, env: Mapping[str, str]) -> KubernetesProvider:
        """Checks the settings, the API's answer and this identity's RBAC; ValueError naming
        the setting when the provider could not work."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        cfg = pod_config(settings)
        cache_volumes(cfg, env)  # the workers' cache settings: refused now, not at each start
        api = api_client(settings)
        try:
            denied = denied_access(client.AuthorizationV1Api(api), cfg.namespace)
            if denied:
                raise ValueError(
                    f"RBAC: the control plane's identity (PLATFORM_KUBERNETES_KUBECONFIG, or its "
                    f"service account in-cluster) may not {', '.join(denied)} in namespace "
                    f"{cfg.namespace!r} (PLATFORM_KUBERNETES_NAMESPACE); grant them in its Role"
                )
            _check_token_secret(client.CoreV1Api(api), cfg)
        except ValueError:
            api.close()
            raise
        except (ApiException, OSError, HTTPError) as exc:
            api.close()
            raise ValueError(
                f"PLATFORM_KUBERNETES_KUBECONFIG: the Kubernetes API at "
                f"{api.configuration.host} did not answer: {_reason(exc)}"
            ) from None
        return cls(api, cfg, env)

    def start(self, spec: WorkerSpec) -> int | None:
        from kubernetes.client.rest import ApiException

        ns, name = self._cfg.namespace, pod_name(spec.worker_id)
        secret = assignment_secret_manifest(self._cfg, spec)
        if secret is not None:
            self._put_secret(secret)
        try:
            pod = _json(
                self._core.create_namespaced_pod(
                    ns, pod_manifest(self._cfg, spec, self._env), **_call()
                )
            )
        except ApiException as exc:
            if exc.status != 409:
                if secret is not None:
                    self._delete_secret(spec.worker_id)
                raise
            # started before (a retried tick): the same worker's pod is that start
            pod = _json(self._core.read_namespaced_pod(name, ns, **_call()))
            if worker_id_of(pod) != spec.worker_id:
                raise RuntimeError(
                    f"pod {name} exists for another worker ({worker_id_of(pod)})"
                ) from None
        if secret is not None:
            try:
                self._core.patch_namespaced_secret(
                    secret_name(spec.worker_id), ns, owner_patch(pod), **_merge_patch()
                )
            except ApiException as exc:
                # the pod runs: the watch deletes the Secret once the pod is gone anyway
                log.warning(
                    "secret of worker %s not owned by its pod: %s", spec.worker_id, _reason(exc)
                )
        log.info(
            "started worker %s pod %s", spec.worker_id, name, extra={"worker_id": spec.worker_id}
        )
        return None

    def stop(self, worker_id: str) -> None:
        self._delete_pod(worker_id, self._cfg.grace_s)

    def kill(self, worker_id: str) -> None:
        self._delete_pod(worker_id, 0)

    def reap(self) -> list[Exited]:
        """The worker pods that ended since the last call, after cleaning up what each left:
        a pod that ended by itself stays until it is deleted, and its Secret goes with it (the
        garbage collector would too, unless the ownerReference was never set).

        Only the leader reaps, so only it deletes: a standby's watch just queues the ends (a
        new leader finds them already handled, and reporting them again changes nothing). A
        pod whose end a standby removed could reach the leader as a bare DELETED, without its
        exit code."""
        out: list[Exited] = []
        while True:
            try:
                end = self._exited.get_nowait()
            except queue.Empty:
                return out
            out.append(end.exited)
            worker_id = end.exited.worker_id
            try:
                if end.delete_pod:
                    self._delete_pod(worker_id, 0)
                self._delete_secret(worker_id)
            except Exception as exc:  # the API is down: the garbage collector is left
                log.warning("ended pod of worker %s not cleaned up: %s", worker_id, exc)

    def shutdown(self, timeout_s: float) -> list[Exited]:
        """This reconciler process stops (a rollout, a drained node): the worker pods are the
        cluster's, not this process's, so they keep serving and the next leader manages them.
        Only the watch stops."""
        self.close()
        return []

    def delete_all(self, timeout_s: float) -> list[Exited]:
        """Delete every worker pod of this platform with its grace (they drain), wait up to
        timeout_s for them to go, then delete what is left with grace 0 (taking the whole
        platform down; no reconciler does this on its own)."""
        deadline = time.monotonic() + timeout_s
        # the first LIST must be done: the watch follows from its version, so no DELETED event
        # of the deletes below can pass unseen
        self._synced.wait(min(timeout_s, REQUEST_TIMEOUT_S))
        pods = self._list()[0]
        waiting = {w for p in pods if (w := worker_id_of(p)) is not None}
        for worker_id in sorted(waiting):
            self._delete_pod(worker_id, self._cfg.grace_s)
        out: list[Exited] = []
        while True:
            for e in self.reap():
                out.append(e)
                waiting.discard(e.worker_id)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for worker_id in sorted(waiting):
            self._delete_pod(worker_id, 0)
            out.append(Exited(worker_id, -9))
        self.close()
        return out

    def step_down(self) -> None:
        """Nothing to do: pods are every replica's to reach, so the new leader manages them."""

    def close(self) -> None:
        """Stop the watch thread and close the client (shutdown does it)."""
        self._closed.set()
        response = self._response
        if response is not None:
            # Unblocks the watch's read. The watch may have ended its response meanwhile
            # (its socket closed or back in the pool): then there is no read left to unblock,
            # and urllib3 raises for it (OSError EBADF, ValueError, RuntimeError).
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                response.shutdown()
        self._thread.join(timeout=5)
        self._api.close()

    # --- API calls ---

    def _put_secret(self, secret: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        ns = self._cfg.namespace
        try:
            self._core.create_namespaced_secret(ns, secret, **_call())
        except ApiException as exc:
            if exc.status != 409:
                raise
            # left by an earlier try of this start: the current credentials win
            name = secret["metadata"]["name"]
            self._core.patch_namespaced_secret(name, ns, {"data": secret["data"]}, **_merge_patch())

    def _delete_secret(self, worker_id: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._core.delete_namespaced_secret(
                secret_name(worker_id), self._cfg.namespace, **_call()
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("secret of worker %s not deleted: %s", worker_id, _reason(exc))

    def _delete_pod(self, worker_id: str, grace_s: int) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._core.delete_namespaced_pod(
                pod_name(worker_id),
                self._cfg.namespace,
                grace_period_seconds=grace_s,
                **_call(),
            )
        except ApiException as exc:
            if exc.status != 404:  # gone already: its end is the watch's to report
                raise

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        answer = _json(
            self._core.list_namespaced_pod(
                self._cfg.namespace, label_selector=self._selector, **_call()
            )
        )
        return answer.get("items") or [], answer["metadata"]["resourceVersion"]

    # --- the watch thread ---

    def _watch_loop(self) -> None:
        from kubernetes.client.rest import ApiException

        version: str | None = None
        failures = 0
        while not self._closed.is_set():
            try:
                if version is None:
                    pods, version = self._list()
                    self._ended(self._tracker.relist(pods), pods)
                    self._synced.set()
                began, since = time.monotonic(), version
                version = self._watch(version)
                failures = 0
                if version == since and time.monotonic() - began < 1.0:
                    # ended at once with nothing new (a proxy's cut?): do not spin on it
                    self._closed.wait(0.5)
            except ApiException as exc:
                if exc.status == 410:
                    version = None  # too old: LIST again
                    continue
                failures += 1
                log.warning("pod watch: %s", _reason(exc))
            except Exception as exc:  # connection reset, API down: resume from `version`
                if self._closed.is_set():
                    return
                failures += 1
                log.warning("pod watch interrupted: %s", exc)
            if failures:
                self._closed.wait(min(0.2 * 2**failures, 10.0))

    def _watch(self, version: str) -> str | None:
        """Follow the pods from `version` until the server ends the watch; the version to
        resume from, or None after 410 Gone (the server no longer has what followed it)."""
        from kubernetes.watch.watch import iter_resp_lines

        if self._closed.is_set():
            return version
        self._response = self._core.list_namespaced_pod(
            self._cfg.namespace,
            label_selector=self._selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(REQUEST_TIMEOUT_S, WATCH_TIMEOUT_S + 30),
        )
        try:
            for line in iter_resp_lines(self._response):
                if self._closed.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._ended(self._tracker.observe(kind, obj), [obj], kind == "DELETED")
        finally:
            self._response.release_conn()
            self._response = None
        return version

    def _ended(
        self, exited: list[Exited], pods: list[dict[str, Any]], deleted: bool = False
    ) -> None:
        """Queue the ends for `reap`, with whether the pod is still to delete (a graceful
        delete's kubelet removes its pod itself)."""
        present = {worker_id_of(p): p for p in pods}
        for e in exited:
            pod = present.get(e.worker_id)
            stays = pod is not None and not deleted and "deletionTimestamp" not in pod["metadata"]
            self._exited.put(_End(e, stays))


def _check_token_secret(core: Any, cfg: PodConfig) -> None:
    from kubernetes.client.rest import ApiException

    try:
        secret = _json(core.read_namespaced_secret(cfg.token_secret, cfg.namespace, **_call()))
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


def _call() -> dict[str, Any]:
    """Keyword arguments of one non-watch call: raw JSON back (no model deserialisation)."""
    return {"_preload_content": False, "_request_timeout": REQUEST_TIMEOUT_S}


def _merge_patch() -> dict[str, Any]:
    """A PATCH's keyword arguments: a JSON merge patch (RFC 7386), whose meaning needs no
    knowledge of the kind's strategic-merge keys (the client's default for a dict)."""
    return {**_call(), "_content_type": "application/merge-patch+json"}


def _json(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data or b"{}")
    return data


def _reason(exc: Exception) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    try:
        message = json.loads(getattr(exc, "body", None) or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return " ".join(str(x) for x in (status, reason, message) if x) or str(exc)


__all__ = ["KubernetesProvider", "api_client", "denied_access"]

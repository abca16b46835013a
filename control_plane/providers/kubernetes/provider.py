"""`KubernetesProvider`: the thin adapter that starts, stops and reaps worker pods (the package's
docstring draws what each call does to the cluster)."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from control_plane.providers.base import Exited, WorkerSpec
from control_plane.providers.kubernetes.api import (
    REQUEST_TIMEOUT_S,
    api_client,
    as_json,
    call,
    check_token_secret,
    denied_access,
    merge_patch,
    reason,
)
from control_plane.providers.kubernetes.config import PodConfig, pod_config
from control_plane.providers.kubernetes.pod_logs import PodLogs
from control_plane.providers.kubernetes.pods import (
    assignment_secret_manifest,
    cache_volumes,
    label_selector,
    owner_patch,
    pod_manifest,
    pod_name,
    secret_name,
)
from control_plane.providers.kubernetes.tracker import worker_id_of
from control_plane.providers.kubernetes.watch import PodWatch
from control_plane.providers.logs import LogStream
from control_plane.settings import Settings

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)


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
        self._watch = PodWatch(self._core, cfg.namespace, label_selector(cfg.instance))
        self._logs = PodLogs(self._core, cfg.namespace)

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
            check_token_secret(client.CoreV1Api(api), cfg)
        except ValueError:
            api.close()
            raise
        except (ApiException, OSError, HTTPError) as exc:
            api.close()
            raise ValueError(
                f"PLATFORM_KUBERNETES_KUBECONFIG: the Kubernetes API at "
                f"{api.configuration.host} did not answer: {reason(exc)}"
            ) from None
        return cls(api, cfg, env)

    def start(self, spec: WorkerSpec) -> int | None:
        from kubernetes.client.rest import ApiException

        ns, name = self._cfg.namespace, pod_name(spec.worker_id)
        secret = assignment_secret_manifest(self._cfg, spec)
        if secret is not None:
            self._put_secret(secret)
        try:
            pod = as_json(
                self._core.create_namespaced_pod(
                    ns, pod_manifest(self._cfg, spec, self._env), **call()
                )
            )
        except ApiException as exc:
            if exc.status != 409:
                if secret is not None:
                    self._delete_secret(spec.worker_id)
                raise
            # started before (a retried tick): the same worker's pod is that start
            pod = as_json(self._core.read_namespaced_pod(name, ns, **call()))
            if worker_id_of(pod) != spec.worker_id:
                raise RuntimeError(
                    f"pod {name} exists for another worker ({worker_id_of(pod)})"
                ) from None
        if secret is not None:
            try:
                self._core.patch_namespaced_secret(
                    secret_name(spec.worker_id), ns, owner_patch(pod), **merge_patch()
                )
            except ApiException as exc:
                # the pod runs: the watch deletes the Secret once the pod is gone anyway
                log.warning(
                    "secret of worker %s not owned by its pod: %s", spec.worker_id, reason(exc)
                )
        log.info(
            "started worker %s pod %s", spec.worker_id, name, extra={"worker_id": spec.worker_id}
        )
        return None

    def stop(self, worker_id: str) -> None:
        self._delete_pod(worker_id, self._cfg.grace_s)

    def kill(self, worker_id: str) -> None:
        self._delete_pod(worker_id, 0)

    def waiting(self) -> dict[str, str]:
        """Worker pods no node takes yet, with the scheduler's message (stuck.py)."""
        return self._watch.waiting_for_a_node()

    def reap(self) -> list[Exited]:
        """The worker pods that ended since the last call, after cleaning up what each left:
        a pod that ended by itself stays until it is deleted, and its Secret goes with it (the
        garbage collector would too, unless the ownerReference was never set).

        Only the leader reaps, so only it deletes: a standby's watch just queues the ends (a
        new leader finds them already handled, and reporting them again changes nothing). A
        pod whose end a standby removed could reach the leader as a bare DELETED, without its
        exit code."""
        out: list[Exited] = []
        self._watch.overdue(self._cfg.unschedulable_grace_s)
        while True:
            try:
                end = self._watch.ends.get_nowait()
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
        self._watch.synced.wait(min(timeout_s, REQUEST_TIMEOUT_S))
        pods = self._watch.list_pods()[0]
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

    def logs(self, worker_id: str, since: datetime | None, follow: bool) -> LogStream:
        """The worker pod's log through the API (`pod_logs.py`); none once the pod is gone."""
        return self._logs.logs(worker_id, since, follow)

    def step_down(self) -> None:
        """Nothing to do: pods are every replica's to reach, so the new leader manages them."""

    def close(self) -> None:
        """Stop the watch thread and close the client (shutdown does it)."""
        self._watch.close()
        self._api.close()

    # --- API calls ---

    def _put_secret(self, secret: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        ns = self._cfg.namespace
        try:
            self._core.create_namespaced_secret(ns, secret, **call())
        except ApiException as exc:
            if exc.status != 409:
                raise
            # left by an earlier try of this start: the current credentials win
            name = secret["metadata"]["name"]
            self._core.patch_namespaced_secret(name, ns, {"data": secret["data"]}, **merge_patch())

    def _delete_secret(self, worker_id: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._core.delete_namespaced_secret(
                secret_name(worker_id), self._cfg.namespace, **call()
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("secret of worker %s not deleted: %s", worker_id, reason(exc))

    def _delete_pod(self, worker_id: str, grace_s: int) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._core.delete_namespaced_pod(
                pod_name(worker_id),
                self._cfg.namespace,
                grace_period_seconds=grace_s,
                **call(),
            )
        except ApiException as exc:
            if exc.status != 404:  # gone already: its end is the watch's to report
                raise

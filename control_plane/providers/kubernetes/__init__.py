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
pods an earlier one created. The pure part does no I/O: `config.py` (the settings as a
`PodConfig`), `pods.py` (manifests from it and a WorkerSpec), `tracker.py` (which pods ended:
`PodTracker`). The adapters: `api.py` (the client, the start-up checks), `watch.py` (the watch
thread), `provider.py` (`KubernetesProvider`).

Errors: `from_settings` raises ValueError naming the setting (image, accelerator types, RBAC,
the worker-token Secret); `start` raises the client's ApiException on what the API refuses.

NOTE: the provider and the client are re-exported here (`from control_plane.providers.kubernetes
import KubernetesProvider, api_client`): the provider's selection and the reconciler's Lease
import them by this path.
"""

from __future__ import annotations

from control_plane.providers.kubernetes.api import REQUIRED_ACCESS, api_client, denied_access
from control_plane.providers.kubernetes.provider import KubernetesProvider

__all__ = ["REQUIRED_ACCESS", "KubernetesProvider", "api_client", "denied_access"]

"""Worker pods that will not start, read from their status (pure): an image that cannot be
pulled, a container the kubelet cannot create, no node that can take the pod.

Such a pod never runs its worker, so it would wait out `max_boot_s` as if booting. Instead the
provider reports it as ended, with a reason the worker's failure, the crash-loop fail-fast and
the callers' cold-start status carry ("no node can take it: 0/3 nodes are available: 3
Insufficient nvidia.com/gpu" is an answer; a ten-minute spinner is not).

An image or container problem does not heal by itself: it ends the worker at once. A pod no
node can take may get one (a cluster autoscaler adding a GPU node takes minutes): it ends the
worker after the deployment's grace (`PLATFORM_KUBERNETES_UNSCHEDULABLE_GRACE_S`).

Example:

    >>> stuck_reason({"status": {"phase": "Pending", "containerStatuses": [{"name": "worker",
    ...     "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}})
    Stuck(reason='image_pull: ImagePullBackOff: not found', waits=False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from control_plane.providers.kubernetes.pods import CONTAINER

# The kubelet's waiting reasons that mean the image will not come.
IMAGE_REASONS = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
)
# ... and that the container cannot be created as specified (a missing Secret or ConfigMap).
CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
# A message is shown to users: long scheduler messages are cut here.
MAX_MESSAGE = 300


@dataclass(frozen=True, slots=True)
class Stuck:
    reason: str  # `image_pull: …`, `pod_config: …` or `unschedulable: …`
    waits: bool  # True: it may still start (a node may come), ended only after a grace


def stuck_reason(pod: Mapping[str, Any]) -> Stuck | None:
    """Why the worker pod cannot start, or None (it runs, starts, or ended)."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    for container in status.get("containerStatuses") or []:
        if container.get("name") != CONTAINER:
            continue
        waiting = (container.get("state") or {}).get("waiting") or {}
        why = str(waiting.get("reason") or "")
        detail = _message(waiting.get("message"))
        if why in IMAGE_REASONS:
            return Stuck(f"image_pull: {why}{detail}", waits=False)
        if why in CONFIG_REASONS:
            return Stuck(f"pod_config: {why}{detail}", waits=False)
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return Stuck(
                f"unschedulable: no node can take it{_message(condition.get('message'))}",
                waits=True,
            )
    return None


def _message(message: Any) -> str:
    text = " ".join(str(message or "").split())
    if not text:
        return ""
    return ": " + (text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…")

"""Which worker pods ended, from what LIST and WATCH return (`PodTracker`; pure: no I/O, no
client), and each pod's worker id and exit code."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from control_plane.providers.base import Exited
from control_plane.providers.kubernetes.pods import CONTAINER, WORKER_ID_LABEL
from control_plane.providers.kubernetes.stuck import Stuck, stuck_reason


def exit_code(pod: Mapping[str, Any]) -> int | None:
    """The worker container's exit code once it terminated, else None."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            terminated = (status.get("state") or {}).get("terminated")
            if terminated is not None:
                return int(terminated.get("exitCode", -9))
    return None


class PodTracker:
    """Which worker pods ended, from what LIST and WATCH show (pure: no I/O).

    NOTE: each worker is reported once, whether its end is seen as a terminal phase, a
    DELETED event, its absence from a LIST after a 410 Gone, or a pod that cannot start
    (`stuck.py`: at once, or for one no node can take, once `overdue` finds its grace over)."""

    def __init__(self) -> None:
        self._alive: dict[str, Mapping[str, Any]] = {}  # worker id → its pod, last seen
        self._reported: set[str] = set()  # ended and reported, pod not yet seen gone
        # worker id → why it waits for a node, and since when (the caller's monotonic clock)
        self._unschedulable: dict[str, tuple[Stuck, float]] = {}

    def relist(self, pods: Iterable[Mapping[str, Any]], now: float = 0.0) -> list[Exited]:
        """Every worker pod that exists now (a LIST): those missing ended while unwatched."""
        pods = list(pods)
        present = {worker_id_of(p) for p in pods} - {None}
        out = []
        for worker_id in sorted(set(self._alive) - present):
            out += self._report(self._alive.pop(worker_id), deleted=True)
        self._reported &= present
        for worker_id in set(self._unschedulable) - present:
            del self._unschedulable[worker_id]
        for p in pods:
            out += self.observe("MODIFIED", p, now)
        return out

    def observe(self, event: str, pod: Mapping[str, Any], now: float = 0.0) -> list[Exited]:
        """One WATCH event (ADDED, MODIFIED, DELETED) of a worker pod; `now`: the caller's
        monotonic clock (when a pod is first seen waiting for a node)."""
        worker_id = worker_id_of(pod)
        if worker_id is None:
            return []
        if event == "DELETED":
            self._alive.pop(worker_id, None)
            self._unschedulable.pop(worker_id, None)
            out = self._report(pod, deleted=True)
            self._reported.discard(worker_id)
            return out
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self._alive.pop(worker_id, None)
            self._unschedulable.pop(worker_id, None)
            return self._report(pod, deleted=False)
        stuck = stuck_reason(pod)
        if stuck is not None and not stuck.waits:
            self._alive.pop(worker_id, None)
            self._unschedulable.pop(worker_id, None)
            return self._report(pod, deleted=False, reason=stuck.reason)
        if stuck is None:
            self._unschedulable.pop(worker_id, None)
        elif worker_id not in self._unschedulable:
            self._unschedulable[worker_id] = (stuck, now)
        else:  # still waiting: the newest message, the first time
            self._unschedulable[worker_id] = (stuck, self._unschedulable[worker_id][1])
        if worker_id not in self._reported:
            self._alive[worker_id] = pod
        return []

    def overdue(self, now: float, grace_s: float) -> list[Exited]:
        """Pods that waited for a node `grace_s` or more (`now`: the clock `observe` got)."""
        out = []
        for worker_id, (stuck, since) in sorted(self._unschedulable.items()):
            if now - since >= grace_s:
                del self._unschedulable[worker_id]
                pod = self._alive.pop(worker_id, None)
                if pod is not None:
                    out += self._report(pod, deleted=False, reason=stuck.reason)
        return out

    def waiting_for_a_node(self) -> dict[str, str]:
        """Worker id → why no node takes its pod yet."""
        return {w: stuck.reason for w, (stuck, _) in self._unschedulable.items()}

    def alive(self) -> set[str]:
        return set(self._alive)

    def _report(
        self, pod: Mapping[str, Any], deleted: bool, reason: str | None = None
    ) -> list[Exited]:
        worker_id = worker_id_of(pod)
        if worker_id is None or worker_id in self._reported:
            return []
        self._reported.add(worker_id)
        code = exit_code(pod)
        if code is None:
            # gone, or failed (evicted, node lost), with no exit of its own: it was killed
            phase = (pod.get("status") or {}).get("phase")
            code = 0 if phase == "Succeeded" and not deleted and reason is None else -9
        return [Exited(worker_id, code, reason)]


def worker_id_of(pod: Mapping[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    worker_id = labels.get(WORKER_ID_LABEL)
    return str(worker_id) if worker_id else None

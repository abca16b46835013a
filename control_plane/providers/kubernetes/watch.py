"""The thread that follows this platform's worker pods: LIST by label selector, then WATCH from
its resourceVersion; 410 Gone → LIST again. What ended (Succeeded, Failed, deleted, missing from
a new LIST) goes, once per worker (`PodTracker`), to a queue the provider's `reap` drains.

    watch = PodWatch(core, "platform", label_selector("platform"))
    watch.ends.get_nowait()   # End(Exited("wrk_…", 0), delete_pod=True)
    watch.close()
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from control_plane.providers.base import Exited
from control_plane.providers.kubernetes.api import REQUEST_TIMEOUT_S, as_json, call, reason
from control_plane.providers.kubernetes.tracker import PodTracker, worker_id_of

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 240  # the server ends a watch after this; it resumes from its resourceVersion


@dataclass(frozen=True, slots=True)
class End:
    exited: Exited
    delete_pod: bool  # it ended by itself: its pod stays until deleted


class PodWatch:
    """Follows the pods of `selector` in `namespace` on its own thread, from construction until
    `close`. `core`: a CoreV1Api."""

    def __init__(self, core: Any, namespace: str, selector: str) -> None:
        self._core = core
        self._namespace = namespace
        self._selector = selector
        self.ends: queue.SimpleQueue[End] = queue.SimpleQueue()
        self.tracker = PodTracker()
        self._lock = threading.Lock()  # the tracker: this thread, and `overdue` from reap
        self._closed = threading.Event()
        self.synced = threading.Event()  # the first LIST is done
        self.response: Any = None  # the watch's HTTP response, closed by `close`
        self.thread = threading.Thread(target=self._loop, name="pod-watch", daemon=True)
        self.thread.start()

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        """The pods now, and the resourceVersion to watch from."""
        answer = as_json(
            self._core.list_namespaced_pod(self._namespace, label_selector=self._selector, **call())
        )
        return answer.get("items") or [], answer["metadata"]["resourceVersion"]

    def waiting_for_a_node(self) -> dict[str, str]:
        with self._lock:
            return self.tracker.waiting_for_a_node()

    def overdue(self, grace_s: float) -> None:
        """Queue the ends of pods that waited for a node `grace_s` or more (their pods stay
        until deleted)."""
        with self._lock:
            ended = self.tracker.overdue(time.monotonic(), grace_s)
        for e in ended:
            self.ends.put(End(e, delete_pod=True))

    def close(self) -> None:
        """Stop the thread (the client is the provider's to close)."""
        self._closed.set()
        response = self.response
        if response is not None:
            # Unblocks the watch's read. The watch may have ended its response meanwhile
            # (its socket closed or back in the pool): then there is no read left to unblock,
            # and urllib3 raises for it (OSError EBADF, ValueError, RuntimeError).
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                response.shutdown()
        self.thread.join(timeout=5)

    def _loop(self) -> None:
        from kubernetes.client.rest import ApiException

        version: str | None = None
        failures = 0
        while not self._closed.is_set():
            try:
                if version is None:
                    pods, version = self.list_pods()
                    with self._lock:
                        ended = self.tracker.relist(pods, time.monotonic())
                    self._ended(ended, pods)
                    self.synced.set()
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
                log.warning("pod watch: %s", reason(exc))
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
        self.response = self._core.list_namespaced_pod(
            self._namespace,
            label_selector=self._selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(REQUEST_TIMEOUT_S, WATCH_TIMEOUT_S + 30),
        )
        try:
            for line in iter_resp_lines(self.response):
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
                    with self._lock:
                        ended = self.tracker.observe(kind, obj, time.monotonic())
                    self._ended(ended, [obj], kind == "DELETED")
        finally:
            self.response.release_conn()
            self.response = None
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
            self.ends.put(End(e, stays))

"""A worker pod's log, read through the Kubernetes API (`read_namespaced_pod_log`): the
Kubernetes side of `providers/logs.py::LogSource`. Example (the API's, from the settings):

    source = PodLogs.from_settings(settings)
    for line in source.logs("wrk_…", since=None, follow=False): ...

`since` becomes `sinceSeconds` (whole seconds, rounded up: a line of the second it falls in
may come back, the caller filters exactly); `follow` keeps the answer open, the API streaming
new lines until the pod's container ends or the stream is closed. A pod that is gone (reaped)
or whose container has not started answers with no lines, not an error.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from control_plane.providers.kubernetes.api import REQUEST_TIMEOUT_S, api_client, reason
from control_plane.providers.kubernetes.pods import pod_name
from control_plane.providers.logs import READ_BYTES, LogStream
from control_plane.settings import Settings

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)
# The API's answers that mean "no log to read": the pod is gone (404), its container is still
# being created or could not start (400 "… is waiting to start").
NO_LOG = frozenset({400, 404})


def since_seconds(since: datetime | None, now: datetime) -> int | None:
    """`sinceSeconds` for lines from `since` on: whole seconds, rounded up, at least 1."""
    if since is None:
        return None
    return max(1, math.ceil((now - since).total_seconds()))


class PodLogs:
    def __init__(self, core: Any, namespace: str) -> None:
        self._core = core  # a CoreV1Api
        self._namespace = namespace

    @classmethod
    def from_settings(cls, settings: Settings) -> PodLogs:
        from kubernetes import client

        api: ApiClient = api_client(settings)
        return cls(client.CoreV1Api(api), settings.kubernetes_namespace)

    def logs(self, worker_id: str, since: datetime | None, follow: bool) -> LogStream:
        return _PodLines(self, worker_id, since, follow)

    def _open(self, worker_id: str, since: datetime | None, follow: bool) -> Any:
        """The API's answer (urllib3's, unread), or None when the pod has no log."""
        from kubernetes.client.rest import ApiException

        kwargs: dict[str, Any] = {"_preload_content": False}
        seconds = since_seconds(since, datetime.now(UTC))
        if seconds is not None:
            kwargs["since_seconds"] = seconds
        if follow:
            kwargs["follow"] = True
            kwargs["_request_timeout"] = (REQUEST_TIMEOUT_S, None)  # quiet for long: fine
        else:
            kwargs["_request_timeout"] = REQUEST_TIMEOUT_S
        try:
            return self._core.read_namespaced_pod_log(
                pod_name(worker_id), self._namespace, **kwargs
            )
        except ApiException as exc:
            if exc.status in NO_LOG:
                return None
            log.warning("log of worker %s unreadable: %s", worker_id, reason(exc))
            raise


class _PodLines:
    def __init__(self, source: PodLogs, worker_id: str, since: datetime | None, follow: bool):
        self._source, self._worker_id, self._since, self._follow = source, worker_id, since, follow
        self._lock = threading.Lock()
        self._response: Any = None
        self._closed = False

    def __iter__(self) -> Iterator[str]:
        response = self._source._open(self._worker_id, self._since, self._follow)
        if response is None:
            return
        with self._lock:
            if self._closed:
                response.release_conn()
                return
            self._response = response
        partial = b""
        try:
            # chunk by chunk as the API sends them (a followed log: each line as it is written)
            for chunk in response.stream(READ_BYTES, decode_content=True):
                *lines, partial = (partial + chunk).split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if partial:
                yield partial.decode(errors="replace")
        except Exception:
            if not self._closed:  # a close() breaks the read on purpose
                raise
        finally:
            response.release_conn()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            response = self._response
        if response is not None:
            response.shutdown()  # wakes a reader blocked on the socket


__all__ = ["NO_LOG", "PodLogs", "since_seconds"]

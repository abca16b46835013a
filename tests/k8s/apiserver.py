"""A small Kubernetes API server for tests: real HTTP on loopback, serving exactly what the
Kubernetes provider, the reconciler's Lease and the test kubelet use.

    core/v1 pods          create, get, list/watch (labelSelector, resourceVersion, 410 Gone),
                          log (sinceSeconds, follow: pod_logs.py),
                          delete (gracePeriodSeconds: a graceful delete of a bound pod only sets
                          deletionTimestamp; the kubelet removes it), status (PUT), binding
    core/v1 secrets       create, get, list, delete, patch (merge patches); stringData → data
    coordination/v1       leases: get, create, replace (resourceVersion → 409 on a conflict)
    authorization/v1      selfsubjectaccessreviews (`deny` lists refused "verb resource"s)
    /version, /api, /apis

Every object written is validated against the official JSON schemas (schemas.py:
`kubernetes_validate`'s bundled ones, strict) and refused with 422 and a Status body otherwise.
Owned objects go with their owner (ownerReferences, as the garbage collector does). `requests`
logs every request, so tests assert on deletes and their grace. The HTTP side: apiserver_http.py;
resources, label selectors and merge patches: objects.py.
"""

from __future__ import annotations

import contextlib
import copy
import socket
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.k8s.errors import ApiError
from tests.k8s.objects import RESOURCES, Event, Request, bookmark, flag, matches, merge_patch, typed
from tests.k8s.schemas import validate


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ApiServer:
    """The server's state; `start()` serves it on `host` (`url`) until `stop()`."""

    host: str = "127.0.0.1"  # a test host's address where other hosts reach it (tests/hosts)
    deny: set[str] = field(default_factory=set)  # "verb resource" refused by access reviews
    requests: list[Request] = field(default_factory=list)
    log_dir: Path | None = None  # the test kubelet's: pods' logs (`…/pods/{name}/log`, pod_logs.py)
    url: str = ""
    _objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    _history: list[Event] = field(default_factory=list)
    _version: int = 1
    _compacted: int = 0  # watches from a version below this get 410 Gone
    _kicks: int = 0  # bumped to end every open watch
    _stopping: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _httpd: ThreadingHTTPServer | None = None
    _sockets: set[socket.socket] = field(default_factory=set)

    # --- lifecycle ---

    def start(self) -> ApiServer:
        from tests.k8s.apiserver_http import Handler as _Handler
        from tests.k8s.apiserver_http import Server as _Server

        server = self

        class Handler(_Handler):
            api = server

        self._httpd = _Server((self.host, 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://{self.host}:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, name="apiserver", daemon=True).start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._kicks += 1
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for s in list(self._sockets):  # keep-alive connections waiting for a next request
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": "test", "namespace": namespace},
                }
            ],
            "current-context": "test",
        }

    # --- test hooks ---

    def compact(self, forget: tuple[tuple[str, str, str], ...] = ()) -> None:
        """What etcd's compaction does to watchers: every open watch ends, and resuming from
        any version seen so far gets 410 Gone, so clients must LIST again. `forget`: objects
        (resource, namespace, name) removed with no event a watch could see."""
        with self._cond:
            for key in forget:
                self._objects.pop(key, None)
            self._version += 1
            self._compacted = self._version
            self._history.clear()
            self._kicks += 1
            self._cond.notify_all()

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._cond:
            obj = self._objects.get((resource, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def names(self, resource: str, namespace: str = "default") -> list[str]:
        with self._cond:
            return sorted(n for r, ns, n in self._objects if r == resource and ns == namespace)

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object directly (a test's fixture: the worker-token Secret)."""
        resource = {kind: r for r, (_, kind, _) in RESOURCES.items()}[obj["kind"]]
        return self.create(resource, obj["metadata"].get("namespace", "default"), obj, {})

    def deletes(self, resource: str, name: str) -> list[Request]:
        suffix = f"/{resource}/{name}"
        return [r for r in self.requests if r.method == "DELETE" and r.path.endswith(suffix)]

    # --- operations (under the lock) ---

    def _write(self, resource: str, ns: str, type_: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        key = (resource, ns, obj["metadata"]["name"])
        if type_ == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self._history.append(Event(self._version, resource, ns, type_, copy.deepcopy(obj)))
        self._cond.notify_all()
        if type_ == "DELETED":
            self._collect_garbage(obj["metadata"].get("uid"))
        return copy.deepcopy(obj)

    def _collect_garbage(self, owner_uid: str | None) -> None:
        for (resource, ns, _), obj in list(self._objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if owner_uid and any(r.get("uid") == owner_uid for r in refs):
                self._write(resource, ns, "DELETED", obj)

    def _current(self, resource: str, ns: str, name: str) -> dict[str, Any]:
        obj = self._objects.get((resource, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
        return obj

    def create(
        self, resource: str, ns: str, body: dict[str, Any], query: dict[str, str]
    ) -> dict[str, Any]:
        typed(resource, body)
        validate(body)
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if meta.setdefault("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match")
        obj = copy.deepcopy(body)
        obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        if resource == "secrets" and "stringData" in obj:
            from base64 import b64encode

            string_data = obj.pop("stringData")
            obj.setdefault("data", {}).update(
                {k: b64encode(v.encode()).decode() for k, v in string_data.items()}
            )
        if resource == "pods":
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        with self._cond:
            if (resource, ns, meta["name"]) in self._objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists')
            if query.get("dryRun") == "All":
                return obj
            return self._write(resource, ns, "ADDED", obj)

    def replace(
        self, resource: str, ns: str, name: str, body: dict[str, Any], sub: str | None
    ) -> dict[str, Any]:
        typed(resource, body)
        validate(body)
        with self._cond:
            current = self._current(resource, ns, name)
            seen = body.get("metadata", {}).get("resourceVersion")
            if seen and seen != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": '
                    "the object has been modified; please apply your changes to the latest version",
                )
            obj = copy.deepcopy(current)
            if sub == "status":
                obj["status"] = copy.deepcopy(body.get("status") or {})
            else:
                keep = {k: obj["metadata"][k] for k in ("uid", "creationTimestamp", "namespace")}
                obj = copy.deepcopy(body)
                obj["metadata"].update(keep)
                if resource == "pods":  # spec is immutable here; status has its own path
                    obj["spec"], obj["status"] = current["spec"], current.get("status", {})
            return self._write(resource, ns, "MODIFIED", obj)

    def patch(
        self, resource: str, ns: str, name: str, body: Any, content_type: str
    ) -> dict[str, Any]:
        if content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            raise ApiError(415, "UnsupportedMediaType", f"patch type {content_type} not supported")
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "a merge patch is a JSON object")
        with self._cond:
            obj = merge_patch(copy.deepcopy(self._current(resource, ns, name)), body)
            validate({k: v for k, v in obj.items() if k != "status"})
            return self._write(resource, ns, "MODIFIED", obj)

    def delete(self, resource: str, ns: str, name: str, grace_s: int | None) -> dict[str, Any]:
        with self._cond:
            obj = copy.deepcopy(self._current(resource, ns, name))
            if resource == "pods":
                spec, meta = obj["spec"], obj["metadata"]
                grace = (
                    spec.get("terminationGracePeriodSeconds", 30) if grace_s is None else grace_s
                )
                running = spec.get("nodeName") and obj["status"].get("phase") not in (
                    "Succeeded",
                    "Failed",
                )
                # a bound pod's kubelet stops it first, then removes it (grace 0)
                if grace > 0 and running:
                    if "deletionTimestamp" in meta and meta["deletionGracePeriodSeconds"] <= grace:
                        return obj
                    meta.update(deletionTimestamp=_now(), deletionGracePeriodSeconds=grace)
                    return self._write(resource, ns, "MODIFIED", obj)
            return self._write(resource, ns, "DELETED", obj)

    def bind(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        validate(body)
        with self._cond:
            obj = copy.deepcopy(self._current("pods", ns, name))
            if obj["spec"].get("nodeName"):
                raise ApiError(409, "Conflict", f'pod "{name}" is already assigned')
            obj["spec"]["nodeName"] = body["target"]["name"]
            self._write("pods", ns, "MODIFIED", obj)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

    def list(self, resource: str, ns: str, selector: str) -> dict[str, Any]:
        api_version, _, list_kind = RESOURCES[resource]
        with self._cond:
            items = [
                copy.deepcopy(o)
                for (r, n, _), o in sorted(self._objects.items())
                if r == resource
                and n == ns
                and matches(o["metadata"].get("labels") or {}, selector)
            ]
            version = self._version
        return {
            "apiVersion": api_version,
            "kind": list_kind,
            "metadata": {"resourceVersion": str(version)},
            "items": items,
        }

    def watch(self, resource: str, ns: str, query: dict[str, str], send: Any) -> None:
        """Stream events to `send(event)` until timeoutSeconds, a kick or the server's stop."""
        selector = query.get("labelSelector", "")
        timeout_s = float(query.get("timeoutSeconds", 1800))
        bookmarks = flag(query.get("allowWatchBookmarks"))
        deadline = datetime.now(UTC).timestamp() + timeout_s

        def wanted(e: Event) -> bool:
            return (
                e.resource == resource
                and e.namespace == ns
                and matches(e.obj["metadata"].get("labels") or {}, selector)
            )

        with self._cond:
            kicks = self._kicks
            since = query.get("resourceVersion", "")
            if since in ("", "0"):  # the current state as ADDED events, then what follows
                backlog = [
                    Event(int(o["metadata"]["resourceVersion"]), r, n, "ADDED", copy.deepcopy(o))
                    for (r, n, _), o in sorted(self._objects.items())
                ]
                last = self._version
            else:
                last = int(since)
                if last < self._compacted:
                    send({"type": "ERROR", "object": ApiError(
                        410, "Expired", f"too old resource version: {last} ({self._compacted})"
                    ).status()})  # fmt: skip
                    return
                backlog = [e for e in self._history if e.version > last]
                last = self._version
        for e in backlog:
            if wanted(e):
                send({"type": e.type, "object": e.obj})
        while True:
            with self._cond:

                def news(seen: int = last) -> bool:
                    return self._version > seen or self._kicks != kicks

                self._cond.wait_for(
                    news, timeout=max(0.0, min(0.5, deadline - datetime.now(UTC).timestamp()))
                )
                if self._kicks != kicks or datetime.now(UTC).timestamp() >= deadline:
                    if bookmarks and not self._stopping and self._kicks == kicks:
                        send({"type": "BOOKMARK", "object": bookmark(resource, self._version)})
                    return
                events = [e for e in self._history if e.version > last]
                last = self._version
            for e in events:
                if wanted(e):
                    send({"type": e.type, "object": e.obj})

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        validate(body)
        attrs = body["spec"].get("resourceAttributes") or {}
        resource = "/".join(filter(None, (attrs.get("resource"), attrs.get("subresource"))))
        denied = f"{attrs.get('verb')} {resource}" in self.deny
        answer = copy.deepcopy(body)
        answer["status"] = {"allowed": not denied, **({"denied": True} if denied else {})}
        return answer

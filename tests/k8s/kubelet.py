"""A test kubelet: runs the pods of the test API server as local processes.

It watches the server's pods, binds those whose nodeSelector and tolerations fit its node
(scheduler and kubelet in one), and runs each one's container — command and args, env with
secretKeyRef / envFrom Secrets resolved from the server, `python` mapped to an interpreter by
the image (pod_spec.py reads what a pod asks for) — reporting Pending → Running → Succeeded /
Failed with the exit code in containerStatuses. A graceful delete gets SIGTERM, then SIGKILL
after the grace; grace 0 (the pod vanishes) SIGKILL at once; then the pod is removed.

A pod that could not boot a worker (unknown image, a missing Secret or key, a command that is
not `python …`, a restartPolicy other than Never, a worker that refuses its arguments) lands in
`problems`; the fixtures fail the test on any.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from control_plane.providers.local import die_with_parent
from tests.k8s.pod_spec import Image, Unbootable, container_argv, container_env, fits

# argparse's exit status: the worker refused its command line
USAGE_ERROR = 2


@dataclass
class _Container:
    proc: subprocess.Popen[bytes]
    started_at: str
    kill_timer: threading.Timer | None = None
    waiter: threading.Thread | None = None  # reports its end
    signals: list[str] = field(default_factory=list)


class Kubelet:
    """Example: `Kubelet(api_url, "node-1", {"pool": "cpu"}, images, log_dir).start()`."""

    def __init__(
        self,
        api_url: str,
        node: str,
        labels: dict[str, str],
        images: dict[str, Image],
        log_dir: Path,
        namespace: str = "default",
        taints: list[dict[str, str]] | None = None,
        capacity: dict[str, int] | None = None,
        host_ip: str = "127.0.0.1",
        before_exec: Callable[[], None] | None = None,
    ) -> None:
        # A node of its own (tests/hosts): its address, and what puts a container in its
        # network namespace; every pod uses the node's network (hostNetwork).
        self.host_ip, self._before_exec = host_ip, before_exec
        self.node, self.labels, self.images = node, labels, images
        self.taints = taints or []
        self.capacity = capacity or {}  # extended resources (nvidia.com/gpu) of this node
        self.namespace = namespace
        self.log_dir = log_dir
        self.problems: list[str] = []
        # (pod, what): "SIGTERM", "SIGKILL", "exit 0", … in order, for tests
        self.actions: list[tuple[str, str]] = []
        self._http = httpx.Client(base_url=api_url, timeout=10)
        self._base = f"/api/v1/namespaces/{namespace}"
        self._containers: dict[str, _Container] = {}
        self._launching: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{node}", daemon=True)
        # PR_SET_PDEATHSIG fires when the thread that forked a child exits: one thread that
        # lives as long as the kubelet starts every container
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix=f"kubelet-{node}-spawn")

    def start(self) -> Kubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Kill every container and stop watching (no process is left)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            containers = list(self._containers.values())
        for c in containers:
            if c.kill_timer:
                c.kill_timer.cancel()
            if c.proc.poll() is None:
                c.proc.kill()
            c.proc.wait(timeout=10)
            if c.waiter is not None:
                c.waiter.join(timeout=10)
        self._spawner.shutdown()
        self._http.close()

    def running(self) -> list[str]:
        with self._lock:
            return [n for n, c in self._containers.items() if c.proc.poll() is None]

    # --- the watch ---

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                params = {"watch": "true", "timeoutSeconds": "1"}
                if version:
                    params["resourceVersion"] = version
                with self._http.stream("GET", f"{self._base}/pods", params=params) as r:
                    for line in r.iter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            version = ""  # 410: start over from the current state
                            break
                        version = obj["metadata"].get("resourceVersion") or version
                        if event["type"] != "BOOKMARK":
                            self._on_event(event["type"], obj)
            except httpx.HTTPError:
                if not self._stop.is_set():
                    time.sleep(0.2)

    def _on_event(self, type_: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        spec = pod["spec"]
        with self._lock:
            container = self._containers.get(name)
        if type_ == "DELETED":
            # gone from the API (grace 0, or removed after it ended): nothing may keep running
            if container is not None and container.proc.poll() is None:
                self._signal(name, container, signal.SIGKILL)
            return
        if spec.get("nodeName") is None:
            if fits(spec, self.labels, self.taints, self.capacity):
                self._bind(name)
            return
        if spec["nodeName"] != self.node:
            return
        if "deletionTimestamp" in pod["metadata"]:
            self._terminate(pod, container)
        elif container is None and pod["status"].get("phase") == "Pending":
            with self._lock:
                if name in self._launching:
                    return
                self._launching.add(name)
            # off the watch: resolving its Secrets may wait for them
            threading.Thread(target=self._launch_safely, args=(pod,), daemon=True).start()

    def _bind(self, name: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }
        self._http.post(f"{self._base}/pods/{name}/binding", json=body)

    # --- containers ---

    def _launch_safely(self, pod: dict[str, Any]) -> None:
        try:
            self._launch(pod)
        except httpx.HTTPError as exc:
            if not self._stop.is_set():
                self.problems.append(f"{pod['metadata']['name']}: not launched: {exc}")

    def _launch(self, pod: dict[str, Any]) -> None:
        name, spec = pod["metadata"]["name"], pod["spec"]
        (c,) = spec["containers"]
        try:
            image, argv = container_argv(spec, c, self.images)
            env = {**image.env, **self._env(pod, c)}
        except Unbootable as exc:
            with self._lock:
                self._launching.discard(name)
            self.problems.append(f"{name}: {exc}")
            self._status(pod, "Pending", {"waiting": {"reason": "CreateContainerConfigError"}})
            return
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = self._spawner.submit(
            subprocess.Popen,
            argv,
            env=env,
            cwd=image.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=self._preexec,
        ).result()
        log.close()
        started = _now()
        container = _Container(proc, started)
        with self._lock:
            self._containers[name] = container
            self._launching.discard(name)
        if self._stop.is_set():
            proc.kill()
        self._status(pod, "Running", {"running": {"startedAt": started}}, pod_ip=self.host_ip)
        container.waiter = threading.Thread(target=self._wait, args=(pod, container), daemon=True)
        container.waiter.start()
        # deleted while it was being launched: the events for that came before the container
        current = self._http.get(f"{self._base}/pods/{name}")
        if current.status_code == 404:
            self._signal(name, container, signal.SIGKILL)
        elif "deletionTimestamp" in current.json()["metadata"]:
            self._terminate(current.json(), container)

    def _preexec(self) -> None:
        if self._before_exec is not None:
            self._before_exec()
        die_with_parent()

    def _env(self, pod: dict[str, Any], c: dict[str, Any]) -> dict[str, str]:
        fields = {
            "status.podIP": self.host_ip,
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": self.namespace,
            "spec.nodeName": self.node,
        }
        return container_env(c, self._secret, fields)

    def _secret(self, name: str) -> dict[str, str]:
        # a Secret created just after its pod: the real kubelet retries too
        for _ in range(25):
            r = self._http.get(f"{self._base}/secrets/{name}")
            if r.status_code == 200:
                data = r.json().get("data") or {}
                return {k: base64.b64decode(v).decode() for k, v in data.items()}
            time.sleep(0.2)
        raise Unbootable(f"CreateContainerConfigError: secret {name!r} not found")

    def _wait(self, pod: dict[str, Any], container: _Container) -> None:
        try:
            self._ended(pod, container)
        except httpx.HTTPError as exc:
            if not self._stop.is_set():
                self.problems.append(f"{pod['metadata']['name']}: status not reported: {exc}")

    def _ended(self, pod: dict[str, Any], container: _Container) -> None:
        name = pod["metadata"]["name"]
        rc = container.proc.wait()
        if container.kill_timer:
            container.kill_timer.cancel()
        code = rc if rc >= 0 else 128 - rc  # as container runtimes report a signal
        self.actions.append((name, f"exit {code}"))
        signalled = bool(container.signals)
        if code == USAGE_ERROR and not signalled:
            self.problems.append(f"{name}: the worker refused its arguments (exit 2)")
        terminated = {"exitCode": code, "startedAt": container.started_at, "finishedAt": _now(),
                      "reason": "Completed" if code == 0 else "Error"}  # fmt: skip
        current = self._http.get(f"{self._base}/pods/{name}")
        if current.status_code != 200:
            return  # deleted with grace 0: nothing left to report to
        pod = current.json()
        self._status(pod, "Succeeded" if code == 0 else "Failed", {"terminated": terminated})
        if "deletionTimestamp" in pod["metadata"]:
            self._http.delete(f"{self._base}/pods/{name}", params={"gracePeriodSeconds": "0"})

    def _terminate(self, pod: dict[str, Any], container: _Container | None) -> None:
        name = pod["metadata"]["name"]
        with self._lock:
            if name in self._launching:
                return  # `_launch` looks again once the container runs
        if container is None:  # never started: nothing to stop
            self._http.delete(f"{self._base}/pods/{name}", params={"gracePeriodSeconds": "0"})
            return
        if container.proc.poll() is not None or container.signals:
            return
        grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
        self._signal(name, container, signal.SIGTERM)

        def kill() -> None:
            if container.proc.poll() is None:
                self._signal(name, container, signal.SIGKILL)

        container.kill_timer = threading.Timer(grace, kill)
        container.kill_timer.daemon = True
        container.kill_timer.start()

    def _signal(self, name: str, container: _Container, sig: signal.Signals) -> None:
        container.signals.append(sig.name)
        self.actions.append((name, sig.name))
        with contextlib.suppress(ProcessLookupError):
            container.proc.send_signal(sig)

    def _status(
        self, pod: dict[str, Any], phase: str, state: dict[str, Any], pod_ip: str | None = None
    ) -> None:
        (c,) = pod["spec"]["containers"]
        status = dict(pod.get("status") or {})
        status.update(
            phase=phase,
            hostIP=self.host_ip,
            containerStatuses=[{
                "name": c["name"], "image": c["image"], "imageID": "", "ready": phase == "Running",
                "restartCount": 0, "started": phase == "Running", "state": state,
            }],
        )  # fmt: skip
        if pod_ip:
            status.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}], startTime=_now())
        body = {**pod, "status": status}
        name = pod["metadata"]["name"]
        for _ in range(5):  # a concurrent write (a delete's deletionTimestamp): read again
            r = self._http.put(f"{self._base}/pods/{name}/status", json=body)
            if r.status_code != 409:
                if r.status_code >= 400 and r.status_code != 404:
                    self.problems.append(f"{name}: status update refused: {r.text}")
                return
            fresh = self._http.get(f"{self._base}/pods/{name}")
            if fresh.status_code != 200:
                return
            body = {**fresh.json(), "status": status}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def subprocess_env() -> dict[str, str]:
    """The test image's own environment (its Dockerfile ENV): what a container starts with."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ}

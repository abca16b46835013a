"""The platform across hosts (network.py: a network namespace per host, one bridge):

    store    Redis (AOF), PostgreSQL, rclone S3
    cp1, cp2 a control-plane host each: API, Celery and a reconciler, started as the chart's
             containers start them (infra/docker/entrypoint.sh roles), the reconcilers with the
             kubernetes provider and its Lease
    worker   the test kubelet's node: worker pods run there as real workers
    (bridge) the test process: the test Kubernetes API server, the webhook receiver, the client

Nothing reaches another host's loopback, so an address that leaked from one host's view (a
127.0.0.1 in a pod's env, a store URL) fails here. The schema comes from the migrate role run
on cp1, as the chart's hook runs it.

A model is uploaded through cp1 and deployed; async jobs with webhooks go through both API
hosts in turn while the leading reconciler is SIGKILLed, FAILOVERS times (then started again,
as the pod's restart would, and running before the next kill). After each kill the other
replica must take the Lease and a new fencing token within 15 s, and a sync call through one
API host and a stream through the other must be answered. Every admitted job ends exactly
once, billing tiles each worker's life (no gap, no duplicate) and every webhook is signed and
sent once: tests/faults/invariants/. No worker gets a second pod.

Sizes: FAULTS_JOBS (24), FAULTS_MAX_TOKENS (100), FAULTS_FAILOVERS (2), as tests/faults.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from control_plane.db.models import ReconcilerFence
from control_plane.embedded.processes import ManagedProcess, spawn, start_redis, start_s3
from control_plane.providers.kubernetes.pods import WORKER_ID_LABEL
from control_plane.reconcile.lease_kubernetes import LEASE_NAME
from control_plane.services.tenants.api_keys import generate_key
from sdk import APIError, Client
from tests.e2e.conftest import build_demo_model
from tests.faults.harness import (
    INVARIANTS,
    FaultRun,
    Sizes,
    run_scenario,
    submit_long_job,
    upload_model,
    utcnow,
    wait_for_log,
)
from tests.faults.invariants import assert_holds
from tests.faults.ledger import Ledger
from tests.fixtures_postgres import start_postgres
from tests.hosts.network import Host, Network, skip_unless_available
from tests.k8s.apiserver import ApiServer
from tests.k8s.conftest import NAMESPACE, REPO, WORKER_IMAGE, put_worker_token
from tests.k8s.kubelet import Image, Kubelet, subprocess_env

# Jobs long enough that each kill finds some in flight (FAULTS_* still win).
SIZES = Sizes.from_env({"FAULTS_JOBS": "24", "FAULTS_MAX_TOKENS": "100", **os.environ})
FAILOVERS = int(os.environ.get("FAULTS_FAILOVERS", "2"))
FAILOVER_BOUND_S = 15.0  # the bound on a failover, with the default Lease (10 s)
API_PORT, REDIS_PORT, S3_PORT = 8000, 6379, 9000
ENTRYPOINT = REPO / "infra" / "docker" / "entrypoint.sh"
CONTROL_PLANES = ("cp1", "cp2")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(SIZES.timeout_s() + 120)]


@pytest.fixture(scope="module")
def net() -> Iterator[Network]:
    skip_unless_available()
    with Network.create(["store", *CONTROL_PLANES, "worker"]) as network:
        yield network


class Store:
    """The store host's servers and what the other hosts need to reach them."""

    def __init__(self, host: Host, root: Path) -> None:
        self.access_key, self.secret_key = "xhost", secrets.token_urlsafe(18)
        self.procs: list[ManagedProcess] = []
        # not under pytest's tmp root, private to root: PostgreSQL runs as `postgres`
        self.pg_root = Path(tempfile.mkdtemp(prefix="platform-test-hosts-pg-"))
        self.pg_root.chmod(0o755)
        try:
            self._start(host, root)
        except BaseException:
            self.stop()
            raise

    def _start(self, host: Host, root: Path) -> None:
        redis = start_redis(root / "redis", REDIS_PORT, root / "redis.log", host=host.ip,
                            before_exec=host.enter)  # fmt: skip
        self.procs.append(redis)
        postgres, server_url = start_postgres(
            self.pg_root / "pg", host=host.ip, before_exec=host.enter
        )
        self.procs.append(postgres)
        s3 = start_s3(root / "objects", S3_PORT, self.access_key, self.secret_key,
                      root / "s3.log", host=host.ip, before_exec=host.enter)  # fmt: skip
        self.procs.append(s3)
        self.redis_url, self.s3_url = redis.extra["url"], s3.extra["url"]
        self.database_url = f"{server_url}/postgres"

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        shutil.rmtree(self.pg_root, ignore_errors=True)


class ControlPlane:
    """One control-plane host: its API, Celery and reconciler processes."""

    def __init__(self, host: Host, root: Path, env: dict[str, str]) -> None:
        self.host, self.root = host, root
        self.replica = f"{host.name}-reconciler"
        self.url = f"http://{host.ip}:{API_PORT}"
        self.env = {
            **env,
            "PLATFORM_API_HOST": host.ip,
            "PLATFORM_INTERNAL_URL": self.url,  # its pods answer to this host's API
            "PLATFORM_STATE_DIR": str(root / "state"),
            "PROMETHEUS_MULTIPROC_DIR": str(root / "metrics"),
            "HOME": str(root),
        }
        (root / "metrics").mkdir(parents=True)
        self.procs: dict[str, ManagedProcess] = {}

    def start(self, role: str) -> ManagedProcess:
        env = self.env
        if role == "reconciler":  # as the chart's reconciler Deployment sets it
            env = {**env, "PLATFORM_PROVIDER": "kubernetes", "PLATFORM_REPLICA_ID": self.replica}
        proc = spawn(f"{self.host.name}-{role}", ["sh", str(ENTRYPOINT), role],
                     self.root / f"{role}.log", env=env, cwd=REPO,
                     before_exec=self.host.enter)  # fmt: skip
        self.procs[role] = proc
        return proc

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            for proc in self.procs.values():
                assert proc.alive(), f"{proc.name} exited:\n{proc.log_tail()}"
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"{self.url} not ready:\n" + self.procs["api"].log_tail()
            )
            time.sleep(0.2)

    def stop(self) -> None:
        for role in ("reconciler", "celery", "api"):
            if role in self.procs:
                self.procs[role].stop(timeout_s=40)


@pytest.fixture(scope="module")
def platform(net: Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("hosts")
    worker = net.hosts["worker"]
    image = Image(sys.executable, REPO, {**subprocess_env(), "HOME": str(root / "worker")})
    (root / "kubelet").mkdir()
    with contextlib.ExitStack() as stack:  # stops everything in reverse, on any failure too
        store = Store(net.hosts["store"], root / "store")
        stack.callback(store.stop)
        server = ApiServer(host=net.gateway).start()
        stack.callback(server.stop)
        node = Kubelet(
            server.url, "worker-1", {"pool": "cpu"}, {WORKER_IMAGE: image}, root / "kubelet",
            host_ip=worker.ip, before_exec=worker.enter,
        ).start()  # fmt: skip
        stack.callback(node.stop)
        token, admin_key = secrets.token_urlsafe(24), generate_key()[0]
        put_worker_token(server, token)
        kubeconfig = root / "kubeconfig.yaml"
        kubeconfig.write_text(json.dumps(server.kubeconfig(NAMESPACE)))
        env = _control_plane_env(store, kubeconfig, token)
        planes = [ControlPlane(net.hosts[n], root / n, env) for n in CONTROL_PLANES]
        for plane in planes:
            stack.callback(plane.stop)
        # what the chart's migration hook runs (the image's platform-migrate), from cp1
        migrate = subprocess.run(
            [sys.executable, "infra/docker/migrate.py"],
            env={**planes[0].env, "BOOTSTRAP_ADMIN_KEY": admin_key}, cwd=REPO,
            preexec_fn=planes[0].host.enter, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        for plane in planes:
            for role in ("api", "celery", "reconciler"):
                plane.start(role)
        for plane in planes:
            plane.wait_ready()
        yield {
            "url": planes[0].url,
            "urls": [p.url for p in planes],
            "api_key": admin_key,
            "database_url": store.database_url,
            "redis_url": store.redis_url,
            "planes": planes,
            "apiserver": server,
            "kubelet": node,
            "gateway": net.gateway,
        }
    assert node.problems == [], node.problems


def _control_plane_env(store: Store, kubeconfig: Path, worker_token: str) -> dict[str, str]:
    """What every control-plane process of both hosts shares (the chart's ConfigMap and
    Secrets); each host adds its own address."""
    return {
        **subprocess_env(),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
        "PLATFORM_DATABASE_URL": store.database_url,
        "PLATFORM_REDIS_URL": store.redis_url,
        "PLATFORM_S3_ENDPOINT_URL": store.s3_url,
        "AWS_ACCESS_KEY_ID": store.access_key,
        "AWS_SECRET_ACCESS_KEY": store.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "PLATFORM_API_PORT": str(API_PORT),
        "PLATFORM_WORKER_TOKEN": worker_token,
        "PLATFORM_SECRET_KEY": secrets.token_urlsafe(32),
        "PLATFORM_LOG_FORMAT": "text",
        "PLATFORM_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver is on the bridge
        "PLATFORM_WEBHOOK_RETRY_SCHEDULE_S": "[0.5, 1, 2, 4, 8, 16]",
        "PLATFORM_WEBHOOK_TIMEOUT_S": "2",
        "PLATFORM_DEFAULT_REQUESTS_PER_MIN": "1000000",
        "PLATFORM_WARM_POOL_MAX": "0",
        "PLATFORM_KUBERNETES_KUBECONFIG": str(kubeconfig),
        "PLATFORM_KUBERNETES_NAMESPACE": NAMESPACE,
        "PLATFORM_KUBERNETES_WORKER_IMAGE": WORKER_IMAGE,
        "PLATFORM_KUBERNETES_DRAIN_GRACE_S": "20",
    }


class LeaderKill:
    """SIGKILLs the reconciler holding the Lease, measures how long until another replica
    holds it with a newer fencing token, starts the killed one again (a container restart),
    then calls through both API hosts: a sync run on one, a stream on the other."""

    def __init__(self, platform: dict[str, Any]) -> None:
        self.planes: list[ControlPlane] = platform["planes"]
        self.server: ApiServer = platform["apiserver"]
        self.ledger = Ledger(platform["database_url"])
        self.clients = [
            Client(base_url=url, api_key=platform["api_key"], timeout=120)
            for url in platform["urls"]
        ]
        self.failovers: list[tuple[str, str, float]] = []  # (from, to, seconds)
        self.in_flight: list[int] = []  # jobs not ended at each kill
        self.jobs: list[str] = []  # submitted here, when a kill found none in flight
        self.calls: list[str] = []  # how each call after a failover went

    def close(self) -> None:
        self.ledger.close()
        for c in self.clients:
            c.close()

    def holder(self) -> str | None:
        lease = self.server.get("leases", NAMESPACE, LEASE_NAME)
        return None if lease is None else lease["spec"].get("holderIdentity")

    def token(self) -> int:
        with self.ledger._sessions() as s:
            return int(s.execute(select(ReconcilerFence.token)).scalar_one())

    def __call__(self, _ledger: Ledger, deployment: str) -> datetime | None:
        holder = self.holder()
        leader = next((p for p in self.planes if p.replica == holder), None)
        assert leader is not None, f"the Lease is held by {holder!r}, no replica of the test"
        before = self.token()
        self.in_flight.append(self._in_flight(deployment))
        fault_at, started = utcnow(), time.monotonic()
        os.kill(leader.procs["reconciler"].pid, signal.SIGKILL)
        leader.procs["reconciler"].popen.wait()
        while not (self.token() > before and self.holder() not in (None, leader.replica)):
            assert time.monotonic() - started < 60, "no replica took over"
            time.sleep(0.1)
        self.failovers.append((leader.replica, str(self.holder()), time.monotonic() - started))
        print(f"failover {self.failovers[-1]}, {self.in_flight[-1]} jobs in flight at the kill")
        log = leader.procs["reconciler"].log_path
        size = log.stat().st_size
        leader.start("reconciler")
        # the next kill's standby: running again (a pod's restart), as the bound supposes
        wait_for_log(log, size, f"reconciler {leader.replica} running", timeout_s=60)
        self.calls += self._through_both(deployment, len(self.failovers))
        return fault_at

    def _in_flight(self, deployment: str) -> int:
        """The jobs not ended; when none are (the run's went faster than the failovers), one
        long job of its own, once it runs."""
        unfinished = len(self.ledger.unfinished_of(deployment))
        if unfinished:
            return unfinished
        client = self.clients[len(self.jobs) % 2]
        self.jobs.append(submit_long_job(client, deployment, SIZES))
        deadline = time.monotonic() + 60
        while self.ledger.statuses(self.jobs[-1:])["running"] == 0:
            assert time.monotonic() < deadline, f"{self.jobs[-1]} never ran"
            time.sleep(0.05)
        return 1

    def _through_both(self, deployment: str, n: int) -> list[str]:
        sync, streamer = self.clients[n % 2], self.clients[(n + 1) % 2]
        out = []
        try:
            text = sync.run(deployment, input={"prompt": "The river", "max_tokens": 2})
            out.append(f"sync via {sync.base_url}: {'ok' if text else 'empty'}")
        except APIError as e:
            out.append(f"sync via {sync.base_url}: HTTP {e.status}")
        try:
            prompt = {"prompt": "A good soup", "max_tokens": 2}
            with streamer.run(deployment, input=prompt, stream=True) as deltas:
                text = "".join(deltas)
            out.append(f"stream via {streamer.base_url}: {'ok' if text else 'empty'}")
        except APIError as e:
            out.append(f"stream via {streamer.base_url}: HTTP {e.status}")
        return out


@pytest.fixture(scope="module")
def fault(platform: dict[str, Any]) -> Iterator[LeaderKill]:
    f = LeaderKill(platform)
    yield f
    f.close()


@pytest.fixture(scope="module")
def run(
    platform: dict[str, Any], fault: LeaderKill, tmp_path_factory: pytest.TempPathFactory
) -> FaultRun:
    model = build_demo_model(tmp_path_factory.mktemp("xhost-model") / "demo")
    uri = upload_model(platform, model, "models/xhost/")
    return run_scenario(
        "cross_host", platform, uri, SIZES, FAILOVERS, fault,
        receiver_host=platform["gateway"], fault_jobs=lambda: fault.jobs,
    )  # fmt: skip


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_across_hosts_and_failovers(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_the_other_replica_took_over_within_15_s(run: FaultRun, fault: LeaderKill) -> None:
    assert run.faults == FAILOVERS == len(fault.failovers)
    assert all(old != new for old, new, _ in fault.failovers), fault.failovers
    slow = [f for f in fault.failovers if f[2] > FAILOVER_BOUND_S]
    assert slow == [], fault.failovers
    assert run.unrecovered == 0
    assert all(fault.in_flight), f"a kill found no job in flight: {fault.in_flight}"


def test_sync_and_stream_answered_through_either_api_host(fault: LeaderKill, run: FaultRun) -> None:
    assert len(fault.calls) == 2 * FAILOVERS
    assert all(c.endswith(": ok") for c in fault.calls), fault.calls
    hosts = {c.split(": ")[0].split(" via ")[1] for c in fault.calls}
    assert hosts == {p.url for p in fault.planes}


def test_no_worker_got_a_second_pod(platform: dict[str, Any], run: FaultRun) -> None:
    server: ApiServer = platform["apiserver"]
    created = Counter(
        r.body["metadata"]["labels"][WORKER_ID_LABEL]
        for r in server.requests
        if r.method == "POST" and r.path.endswith("/pods") and r.status == 201
    )
    assert created, "no worker pod was created"
    assert [w for w, n in created.items() if n > 1] == []

"""Network faults between the workers and Redis or the object store, while async jobs with
webhooks keep arriving: the workers' traffic (and only theirs) goes through two TCP fault
proxies (tcp_proxy.py), given to them by the operator settings PLATFORM_WORKER_REDIS_URL and
PLATFORM_WORKER_S3_ENDPOINT_URL. The faults, in turn:

    redis-reset     every worker↔Redis connection gets an RST; the port refuses for 1 s
    redis-drop      worker↔Redis is a black hole for DROP_S (shorter than a heartbeat's
                    TTL: a worker must ride it out), then new connections work again
    redis-delay     DELAY_S more latency each way on worker↔Redis for DELAY_FOR_S
    s3-reset        during a cold start's weight load (the serving worker is SIGKILLed, a
    s3-drop         replacement loads through the slowed S3 path): every connection reset
                    and the port refused for 1 s, or a black hole for DROP_S

After each, a sync call is made (the scenario's own jobs may all have ended during the
fault), and a job picked up later must succeed (recovery); at the end the one checker
(invariants/, I1–I6) must find nothing, and no worker may have failed but those killed.

The platform is this module's own (the workers' paths are set when it starts), without the
weight cache tiers, so that every cold start reads the store.

Sizes: FAULTS_JOBS (12), FAULTS_NETWORK_FAULTS (5: each kind once); `make faults` runs the
long form.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import embedded_platform
from tests.faults.conftest import FAULT_PLATFORM_ENV
from tests.faults.harness import (
    INVARIANTS,
    SIZES,
    FaultRun,
    Injector,
    probe,
    run_scenario,
    scenario_marks,
    upload_model,
    utcnow,
)
from tests.faults.invariants import assert_holds
from tests.faults.ledger import Ledger
from tests.faults.tcp_proxy import FaultProxy
from tests.faults.test_worker_kills import is_worker

KINDS = ("redis-reset", "redis-drop", "redis-delay", "s3-reset", "s3-drop")
# A black hole's length: under HEARTBEAT_TTL_S (10 s) less a Redis command's timeout, so a
# worker that notices it in time keeps its heartbeat.
DROP_S = 3.0
DELAY_S, DELAY_FOR_S = 0.2, 4.0
REFUSE_S = 1.0
# Latency on the S3 path while a replacement loads: the demo model loads in tens of
# milliseconds on loopback, too quickly for a fault to land inside the load otherwise.
S3_SLOW_S = 0.1
TIMEOUT_S = 600 + 3 * SIZES.jobs + 90 * SIZES.network_faults

pytestmark = scenario_marks(TIMEOUT_S)


@dataclass
class NetworkPlatform:
    """The embedded platform (platform.json and more) and the proxies on its workers' paths."""

    state: dict[str, Any]
    redis: FaultProxy  # worker ↔ Redis
    s3: FaultProxy  # worker ↔ the S3 server


@pytest.fixture(scope="module")
def net_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetworkPlatform]:
    # The proxies listen before the platform starts (its workers are given their ports) and
    # learn the upstreams from platform.json once it is up; the warm-pool worker started
    # meanwhile waits in the proxy for that.
    with FaultProxy() as redis_proxy, FaultProxy() as s3_proxy:
        extra = {
            **FAULT_PLATFORM_ENV,
            "PLATFORM_WORKER_REDIS_URL": f"redis://127.0.0.1:{redis_proxy.port}/0",
            "PLATFORM_WORKER_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_proxy.port}",
            # no weight cache tiers: every cold start reads the store, through the proxy
            "PLATFORM_LOADER_CACHE_DIR": "",
            "PLATFORM_LOADER_HOST_CACHE_BYTES": "0",
        }
        state_dir = tmp_path_factory.mktemp("network-platform")
        with embedded_platform(state_dir, extra) as state:
            redis_url = urlsplit(state["redis_url"])
            assert redis_url.path == "/0", "the workers' Redis URL above names database 0"
            redis_proxy.retarget((redis_url.hostname or "", redis_url.port or 6379))
            s3_url = urlsplit(state["s3_endpoint_url"])
            s3_proxy.retarget((s3_url.hostname or "", s3_url.port or 80))
            yield NetworkPlatform(state, redis_proxy, s3_proxy)


class NetworkFaults(Injector):
    """The fault injector: the next kind of KINDS on each call (`run_scenario`'s `inject`)."""

    def __init__(self, platform: NetworkPlatform) -> None:
        super().__init__(platform.state, timeout_s=120)
        self.platform = platform
        self.done: list[str] = []  # kinds injected, in order
        self.killed: set[str] = set()  # workers SIGKILLed to force a cold start
        # per S3 fault: whether a replacement was seen loading when it struck
        self.hit_a_load: list[bool] = []

    def __call__(self, ledger: Ledger, deployment: str) -> datetime | None:
        kind = KINDS[len(self.done) % len(KINDS)]
        inject: dict[str, Callable[[Ledger, str], datetime | None]] = {
            "redis-reset": self.redis_reset,
            "redis-drop": self.redis_drop,
            "redis-delay": self.redis_delay,
            "s3-reset": lambda ledger, dep: self.s3_cold_start(ledger, dep, drop=False),
            "s3-drop": lambda ledger, dep: self.s3_cold_start(ledger, dep, drop=True),
        }
        fault_at = inject[kind](ledger, deployment)
        if fault_at is not None:  # else this kind comes again next time
            self.done.append(kind)
            # NOTE: a job picked up after the fault by construction: the scenario's own can
            # all end while a fault is under way (the S3 ones wait for a replacement's load)
            self.probes.append(probe(self.client, deployment, kind))
        return fault_at

    def redis_reset(self, _ledger: Ledger, _deployment: str) -> datetime:
        fault_at = utcnow()
        self.platform.redis.reset(refuse_s=REFUSE_S)
        time.sleep(REFUSE_S)
        return fault_at

    def redis_drop(self, _ledger: Ledger, _deployment: str) -> datetime:
        fault_at = utcnow()
        self.platform.redis.drop()
        time.sleep(DROP_S)
        self.platform.redis.heal()
        return fault_at

    def redis_delay(self, _ledger: Ledger, _deployment: str) -> datetime:
        fault_at = utcnow()
        self.platform.redis.delay(DELAY_S)
        time.sleep(DELAY_FOR_S)
        self.platform.redis.heal()
        return fault_at

    def s3_cold_start(self, ledger: Ledger, deployment: str, drop: bool) -> datetime | None:
        """SIGKILL the serving worker; once its replacement loads, break the S3 path."""
        s3 = self.platform.s3
        serving = [
            (w, pid)
            for w, state, pid in ledger.workers(deployment)
            if state in ("idle", "busy") and pid and is_worker(pid, w)
        ]
        if not serving:
            return None
        s3.delay(S3_SLOW_S)
        for worker_id, pid in serving:
            self.killed.add(worker_id)
            os.kill(pid, signal.SIGKILL)
        # the replacement: a new boot, or a warm-pool worker assigned to the deployment
        deadline = time.monotonic() + 60
        while not (loading := self._loading(ledger, deployment)) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.hit_a_load.append(loading)
        fault_at = utcnow()
        if drop:
            s3.drop()
            time.sleep(DROP_S)
        else:
            s3.reset(refuse_s=REFUSE_S)
            time.sleep(REFUSE_S)
        s3.heal()
        return fault_at

    def _loading(self, ledger: Ledger, deployment: str) -> bool:
        return any(
            state == "loading" and w not in self.killed
            for w, state, _ in ledger.workers(deployment)
        )


@pytest.fixture(scope="module")
def faults(net_platform: NetworkPlatform) -> Iterator[NetworkFaults]:
    with NetworkFaults(net_platform) as f:
        yield f


@pytest.fixture(scope="module")
def run(net_platform: NetworkPlatform, faults: NetworkFaults, fault_model: Path) -> FaultRun:
    # from the store: the workers read it through the S3 proxy
    uri = upload_model(net_platform.state, fault_model, "models/network-faults")
    return run_scenario(
        "network_faults", net_platform.state, uri, SIZES, SIZES.network_faults, faults
    )


@pytest.mark.parametrize("invariant", INVARIANTS)
def test_invariant_holds_after_network_faults(run: FaultRun, invariant: str) -> None:
    assert_holds(run.violations, invariant)


def test_every_fault_was_injected_and_recovered(run: FaultRun, faults: NetworkFaults) -> None:
    if run.unrecovered == 0:  # then each recovery is its fault's, in order
        print([(k, round(r, 1)) for k, r in zip(faults.done, run.recoveries_s, strict=True)])
    assert run.faults == SIZES.network_faults, f"injected only {faults.done}"
    assert run.unrecovered == 0, "no job succeeded after a fault"
    assert set(faults.probes) == {"ok"}, faults.probes


def test_the_workers_traffic_went_through_the_proxies(
    run: FaultRun, net_platform: NetworkPlatform
) -> None:
    """Otherwise the faults above broke nothing the workers use."""
    for proxy in (net_platform.redis, net_platform.s3):
        assert proxy.stats.accepted > 0 and proxy.stats.forwarded_bytes > 0


def test_each_s3_fault_struck_a_weight_load(run: FaultRun, faults: NetworkFaults) -> None:
    if not faults.hit_a_load:
        pytest.skip("no S3 fault in this run (FAULTS_NETWORK_FAULTS < 4)")
    assert all(faults.hit_a_load), f"loads seen per S3 fault: {faults.hit_a_load}"


def test_no_worker_fails_but_those_killed(
    run: FaultRun, net_platform: NetworkPlatform, faults: NetworkFaults
) -> None:
    """A short partition, a reset or a slow path costs no worker: each notices and reconnects
    within its heartbeat's TTL, and a load retries what the store did not answer."""
    ledger = Ledger(net_platform.state["database_url"])
    try:
        failed = ledger.worker_failures("faults-network-faults")
    finally:
        ledger.close()
    assert [(w, reason) for w, reason in failed if w not in faults.killed] == []

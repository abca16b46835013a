"""The reconciler's Kubernetes Lease (reconcile/lease_kubernetes.py) against the test API
server, which validates every Lease against the official schema and answers a write with a
stale resourceVersion 409, as a real API server does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from control_plane.providers.kubernetes import api_client
from control_plane.reconcile.lease_kubernetes import LEASE_NAME, KubernetesLease
from control_plane.settings import Settings
from tests.k8s.apiserver import ApiServer
from tests.k8s.conftest import NAMESPACE


class Clock:
    """Wall and monotonic time moving together (each replica's monotonic clock: `mono`)."""

    def __init__(self) -> None:
        self.start = self.now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def mono(self) -> float:
        return (self.now - self.start).total_seconds()


@pytest.fixture
def coordination(k8s_settings: Settings) -> Iterator[Any]:
    api = api_client(k8s_settings)
    yield client.CoordinationV1Api(api)
    api.close()


def lease(api: Any, holder: str, clock: Clock) -> KubernetesLease:
    return KubernetesLease(api, NAMESPACE, holder, 10.0, clock=clock, monotonic=clock.mono)


def stored(apiserver: ApiServer) -> dict[str, Any]:
    obj = apiserver.get("leases", NAMESPACE, LEASE_NAME)
    assert obj is not None
    spec: dict[str, Any] = obj["spec"]
    return spec


def test_one_holder_renews_and_another_takes_it_once_it_runs_out(
    apiserver: ApiServer, coordination: Any
) -> None:
    clock = Clock()
    a, b = lease(coordination, "a", clock), lease(coordination, "b", clock)
    assert a.hold(), "no Lease yet: created with a as holder"
    assert not b.hold()
    clock.now += timedelta(seconds=9)
    assert a.hold(), "renewed"
    clock.now += timedelta(seconds=9)
    assert not b.hold(), "b sees the renewal now: it counts from here"
    clock.now += timedelta(seconds=9.9)
    assert not b.hold(), "unchanged for 9.9 s of b's clock: still a's"
    assert stored(apiserver)["holderIdentity"] == "a"
    clock.now += timedelta(seconds=0.1)
    assert b.hold(), "unchanged for 10 s as b saw it: b takes it"
    spec = stored(apiserver)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["leaseDurationSeconds"] == 10
    assert not a.hold(), "a learns at its next renewal"


def test_a_released_lease_is_taken_at_once(apiserver: ApiServer, coordination: Any) -> None:
    clock = Clock()
    a, b = lease(coordination, "a", clock), lease(coordination, "b", clock)
    assert a.hold()
    a.release()
    assert "holderIdentity" not in stored(apiserver) or not stored(apiserver)["holderIdentity"]
    assert b.hold()


class _ReadThen:
    """The real API, with `between` run after each read: another replica's write lands between
    this replica's read and its write."""

    def __init__(self, api: Any, between: Callable[[], None]) -> None:
        self._api = api
        self._between = between

    def read_namespaced_lease(self, *args: Any, **kw: Any) -> Any:
        out = self._api.read_namespaced_lease(*args, **kw)
        self._between()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def test_of_two_replicas_taking_it_at_once_one_wins(
    apiserver: ApiServer, coordination: Any
) -> None:
    clock = Clock()
    assert lease(coordination, "old", clock).hold()
    clock.now += timedelta(seconds=30)  # the old leader is gone
    b = lease(coordination, "b", clock)
    racing = {"on": False}
    a = lease(_ReadThen(coordination, lambda: racing["on"] and b.hold()), "a", clock)
    assert not a.hold() and not b.hold(), "first sight of the record: both wait a duration"
    clock.now += timedelta(seconds=10)
    racing["on"] = True
    assert not a.hold(), "b wrote between a's read and a's write: a's write is a 409"
    assert stored(apiserver)["holderIdentity"] == "b"


def test_a_skewed_wall_clock_neither_takes_a_live_lease_nor_keeps_a_dead_one(
    apiserver: ApiServer, coordination: Any
) -> None:
    """The holder's renewTime is its own wall clock: an hour ahead or behind changes nothing
    for the others, who time the record on their own monotonic clocks."""
    clock = Clock()
    a, b = lease(coordination, "a", clock), lease(coordination, "b", clock)
    assert a.hold()
    for skew in (timedelta(hours=-1), timedelta(hours=1)):
        a._clock = lambda skew=skew: clock.now + skew
        for _ in range(5):
            clock.now += timedelta(seconds=5)
            assert a.hold(), "renewed every 5 s"
            assert not b.hold(), f"a live lease, renewTime skewed {skew}: b waits"
    clock.now += timedelta(seconds=9)
    assert not b.hold()
    clock.now += timedelta(seconds=1)
    assert b.hold(), "a stopped renewing: 10 s of b's clock later, b takes it"

"""The reconciler's lease under Kubernetes: a coordination.k8s.io/v1 Lease, the object
Kubernetes' own controllers elect their leaders with (the rules: domain/lease.py).

A Lease does not expire by itself: it holds who renewed it last and when. Each replica reads
it, decides (`claim`), and writes it back with the resourceVersion it read, so of two replicas
that both try to take it, the API server lets one write and answers the other 409 Conflict.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from control_plane.domain.clock import Clock, utc_now
from control_plane.domain.lease import Claim, LeaseRecord, Observed, claim, observe
from control_plane.reconcile.lease import LeaseUnreachable
from control_plane.settings import Settings

LEASE_NAME = "platform-reconciler"
REQUEST_TIMEOUT_S = 5.0  # one call: well inside the lease, so a slow API cannot outlast it


class KubernetesLease:
    def __init__(
        self,
        api: Any,
        namespace: str,
        holder: str,
        lease_s: float,
        clock: Clock = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`api`: a kubernetes.client.CoordinationV1Api. `clock` writes the Lease's times
        (for people and tools reading it); `monotonic` alone decides expiry
        (domain/lease.py)."""
        self.api = api
        self.namespace = namespace
        self.holder = holder
        self.lease_s = lease_s
        self._clock = clock
        self._monotonic = monotonic
        self._observed: Observed | None = None

    @classmethod
    def from_settings(cls, settings: Settings, holder: str) -> KubernetesLease:
        from kubernetes import client

        from control_plane.providers.kubernetes import api_client

        return cls(
            client.CoordinationV1Api(api_client(settings)),
            settings.kubernetes_namespace,
            holder,
            settings.reconciler_lease_s,
        )

    def hold(self) -> bool:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        now = self._clock()
        try:
            lease = self._read()
            record = None if lease is None else _record(lease)
            self._observed = observe(self._observed, record, self._monotonic())
            action = claim(self._observed, self.holder, self._monotonic())
            if action is Claim.WAIT:
                return False
            if lease is None:
                body = client.V1Lease(
                    metadata=client.V1ObjectMeta(name=LEASE_NAME, namespace=self.namespace),
                    spec=self._spec(now, acquired=now, transitions=0),
                )
                self.api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=REQUEST_TIMEOUT_S
                )
                return True
            spec = lease.spec
            if action is Claim.TAKE:
                lease.spec = self._spec(
                    now, acquired=now, transitions=(spec.lease_transitions or 0) + 1
                )
            else:
                lease.spec = self._spec(
                    now, acquired=spec.acquire_time, transitions=spec.lease_transitions or 0
                )
            # carries the resourceVersion read above: a concurrent writer makes this a 409
            self.api.replace_namespaced_lease(
                LEASE_NAME, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT_S
            )
            return True
        except ApiException as exc:
            if exc.status == 409:  # another replica wrote it first: theirs
                return False
            raise LeaseUnreachable(f"Kubernetes API answered {exc.status}") from exc
        except OSError as exc:  # urllib3's connection errors are OSErrors
            raise LeaseUnreachable(str(exc)) from exc

    def release(self) -> None:
        from kubernetes.client.rest import ApiException

        try:
            lease = self._read()
            if lease is None or lease.spec.holder_identity != self.holder:
                return
            lease.spec.holder_identity = None
            lease.spec.renew_time = None
            self.api.replace_namespaced_lease(
                LEASE_NAME, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT_S
            )
        except (ApiException, OSError):
            pass  # it runs out by itself

    def _read(self) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return self.api.read_namespaced_lease(
                LEASE_NAME, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _spec(self, now: datetime, acquired: datetime | None, transitions: int) -> Any:
        from kubernetes import client

        return client.V1LeaseSpec(
            holder_identity=self.holder,
            # whole seconds in the API; rounded up, never shorter than the setting
            lease_duration_seconds=math.ceil(self.lease_s),
            acquire_time=acquired,
            renew_time=now,
            lease_transitions=transitions,
        )


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=spec.holder_identity,
        renewed_at=spec.renew_time,
        duration_s=float(spec.lease_duration_seconds or 0),
    )

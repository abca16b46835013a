"""The discrete-event core: workers, requests and the events between them.

One ``Sim`` replays one workload under one policy and one cold-start time. Events sit in a heap
ordered by (time, kind, sequence number), so equal times resolve the same way on every run: a
worker that becomes ready at t serves a request arriving at t; a slot freed at t is free for a
request arriving at t; a tick at t sees everything that happened at t.

Mechanics (the same for every policy):
- a worker has ``slots`` request slots and becomes ready ``t_cold_s`` after it is started;
- requests of a deployment wait in one FIFO queue; the head goes to the ready, non-draining
  worker with a free slot that holds the most requests (packing, so surplus workers go idle
  and can be released), ties to the oldest worker;
- scaling down releases idle ready workers first, then stops booting ones (newest first), then
  drains the least-loaded busy ones: a draining worker takes nothing new, finishes what it
  holds, then stops. A request is never killed.

A policy (``policies.Policy``) sees each deployment's ``DeploymentRuntime`` on every tick and
returns the number of workers it wants (counted as ready non-draining + booting), or None.

Cold start: a request is cold when the worker that served it became ready after the request
arrived. FIFO dispatch makes this exactly "when it arrived, no ready worker could take it (every
ready worker was full, or there was none), and it waited for a booting worker" — a request that
waits only for a busy ready worker to free a slot is queued, not cold.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from control_plane.domain.scaling.decide import MAX_TICK_S
from control_plane.domain.scaling.service import MAX_SAMPLES

if TYPE_CHECKING:
    from bench.autoscale.policies import Policy
    from bench.autoscale.workloads import Deployment, Workload

TICK_S = MAX_TICK_S  # the reconciler's period: the longest the live one may have
# Event kinds, in the order they resolve at equal times.
READY, DONE, STOP, ARRIVAL, START, REFIT, TICK = range(7)
# A run that has not served everything this long after the last arrival has a broken policy.
MAX_OVERRUN_S = 86_400.0


@dataclass(slots=True, eq=False)
class Worker:
    id: int
    started_at: float
    ready_at: float  # started_at + t_cold (also while booting: when it will be ready)
    ready: bool = False
    draining: bool = False
    running: int = 0  # requests it holds
    busy_since: float = 0.0  # when `running` last went from 0 to 1
    used_s: float = 0.0  # seconds with ≥ 1 request, closed intervals only


@dataclass(slots=True, eq=False)
class DeploymentRuntime:
    """What the simulator knows about one deployment now (policies read it, never write it)."""

    index: int
    spec: Deployment
    slots: int
    workers: list[Worker] = field(default_factory=list)  # started and not yet stopped
    queue: deque[int] = field(default_factory=deque)  # waiting request indices, FIFO
    running: int = 0  # requests on workers, draining ones included
    ready: int = 0  # ready workers not draining
    booting: int = 0  # started, not ready, not stopped
    boot_sum_s: float = 0.0  # start → ready of every completed boot
    boot_count: int = 0
    # (completed at, slot-holding seconds) of the latest completed requests, oldest first: as
    # many as the live autoscaler reads back from SQL (`scaling.service`)
    ended: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    idle_since: float | None = None  # when queued + running last went to 0 (None: never)

    @property
    def capacity(self) -> int:
        return self.ready + self.booting

    @property
    def demand(self) -> int:
        return len(self.queue) + self.running


@dataclass(slots=True)
class RunRecord:
    """Raw outcome of one run; ``metrics.summarize`` turns it into numbers."""

    arrival_s: list[float]  # per request, in global request order
    start_s: list[float]  # when service began
    cold: list[bool]
    sync: list[bool]
    deployment: list[int]  # request → deployment index
    provisioned_s: float  # worker-seconds from start to stop, booting and draining included
    used_s: float  # worker-seconds with ≥ 1 request
    boots: int
    end_s: float  # the horizon: the last completion or the workload's end, whichever later


class Sim:
    def __init__(self, workload: Workload, policy: Policy, t_cold_s: float, slots: int) -> None:
        self.workload = workload
        self.policy = policy
        self.t_cold_s = t_cold_s
        self.slots = slots
        self.deployments = [
            DeploymentRuntime(i, d, slots) for i, d in enumerate(workload.deployments)
        ]
        self._events: list[tuple[float, int, int, int, int]] = []  # (t, kind, seq, a, b)
        self._seq = 0
        self._workers: dict[int, Worker] = {}
        self._worker_dep: dict[int, DeploymentRuntime] = {}
        self._next_worker = 0
        self._planned_ready: list[float] = []  # ready times of scheduled starts
        self.now = 0.0
        # per request, in global order
        self.arrival_s: list[float] = []
        self.service_s: list[float] = []
        self.sync: list[bool] = []
        self.request_dep: list[int] = []
        for dep in self.deployments:
            for r in dep.spec.requests:
                self.arrival_s.append(r.arrival_s)
                self.service_s.append(r.service_s)
                self.sync.append(r.sync)
                self.request_dep.append(dep.index)
        n = len(self.arrival_s)
        self.start_s = [math.nan] * n
        self.cold = [False] * n
        self._remaining = n
        self._provisioned_s = 0.0
        self._used_s = 0.0
        self._boots = 0

    # the run ----------------------------------------------------------------------------------

    def run(self) -> RunRecord:
        self._events = [(t, ARRIVAL, i, i, 0) for i, t in enumerate(self.arrival_s)]
        self._seq = len(self._events)
        heapq.heapify(self._events)
        self.policy.attach(self)
        for dep in self.deployments:
            for t, delta in self.policy.schedule(dep):
                if delta > 0:  # ready at t exactly (t - t_cold + t_cold may round past t)
                    self._planned_ready.append(t)
                    self._push(t - self.t_cold_s, START, dep.index, len(self._planned_ready) - 1)
                else:
                    self._push(t, STOP, dep.index, 0)
        self._push(0.0, TICK, 0, 0)
        if self.policy.refit_s:
            self._push(0.0, REFIT, 0, 0)
        end = self.workload.duration_s
        events = self._events
        while events:
            t, kind, _, a, b = heapq.heappop(events)
            self.now = t
            if kind == ARRIVAL:
                self._arrive(a)
            elif kind == DONE:
                self._done(a, b)
            elif kind == READY:
                self._ready(a)
            elif kind == TICK:
                if self._remaining == 0 and t >= end:
                    break
                if t > end + MAX_OVERRUN_S:
                    raise RuntimeError(f"{self.policy.name}: requests still waiting at t={t:.0f}")
                for dep in self.deployments:
                    want = self.policy.tick(dep, t)
                    if want is not None:
                        self.scale_to(dep, want)
                self._push(t + TICK_S, TICK, 0, 0)
            elif kind == REFIT:
                self.policy.refit(t)
                self._push(t + self.policy.refit_s, REFIT, 0, 0)
            elif kind == START:
                self.start(self.deployments[a], 1, self._planned_ready[b])
            elif kind == STOP:  # a scheduled release takes a ready worker, never a booting one
                self.release(self.deployments[a], 1, booting_too=False)
        horizon = max(end, self.now)
        for w in list(self._workers.values()):
            self._stop(self._worker_dep[w.id], w, horizon)
        return RunRecord(
            self.arrival_s,
            self.start_s,
            self.cold,
            self.sync,
            self.request_dep,
            self._provisioned_s,
            self._used_s,
            self._boots,
            horizon,
        )

    def _push(self, t: float, kind: int, a: int, b: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, a, b))

    # requests ---------------------------------------------------------------------------------

    def _arrive(self, req: int) -> None:
        dep = self.deployments[self.request_dep[req]]
        self.policy.on_arrival(dep, self.now)
        if not dep.queue:
            w = self._pick(dep)
            if w is not None:
                self._assign(dep, w, req)
                return
        dep.queue.append(req)

    def _pick(self, dep: DeploymentRuntime) -> Worker | None:
        best: Worker | None = None
        for w in dep.workers:
            if (
                w.ready
                and not w.draining
                and w.running < self.slots
                and (best is None or w.running > best.running)
            ):
                best = w
        return best

    def _assign(self, dep: DeploymentRuntime, w: Worker, req: int) -> None:
        now = self.now
        self.start_s[req] = now
        self.cold[req] = w.ready_at > self.arrival_s[req]
        if w.running == 0:
            w.busy_since = now
        w.running += 1
        dep.running += 1
        self._push(now + self.service_s[req], DONE, req, w.id)

    def _dispatch(self, dep: DeploymentRuntime) -> None:
        while dep.queue:
            w = self._pick(dep)
            if w is None:
                return
            self._assign(dep, w, dep.queue.popleft())

    def _done(self, req: int, worker_id: int) -> None:
        w = self._workers[worker_id]
        dep = self._worker_dep[worker_id]
        w.running -= 1
        dep.running -= 1
        dep.ended.append((self.now, self.service_s[req]))
        self._remaining -= 1
        if w.running == 0:
            w.used_s += self.now - w.busy_since
            if w.draining:
                self._stop(dep, w, self.now)
        if not w.draining:
            self._dispatch(dep)
        if dep.running == 0 and not dep.queue:
            dep.idle_since = self.now

    # workers ----------------------------------------------------------------------------------

    def start(self, dep: DeploymentRuntime, n: int, ready_at: float | None = None) -> None:
        for _ in range(n):
            ready = self.now + self.t_cold_s if ready_at is None else ready_at
            w = Worker(self._next_worker, self.now, ready)
            self._next_worker += 1
            self._workers[w.id] = w
            self._worker_dep[w.id] = dep
            dep.workers.append(w)
            dep.booting += 1
            self._boots += 1
            self._push(w.ready_at, READY, w.id, 0)

    def _ready(self, worker_id: int) -> None:
        w = self._workers.get(worker_id)
        if w is None:  # stopped while booting
            return
        dep = self._worker_dep[worker_id]
        w.ready = True
        dep.booting -= 1
        dep.ready += 1
        dep.boot_sum_s += self.now - w.started_at
        dep.boot_count += 1
        self._dispatch(dep)

    def release(self, dep: DeploymentRuntime, n: int, booting_too: bool = True) -> None:
        """Take `n` workers out of capacity: idle ones stop, then booting ones (newest first),
        then the least-loaded busy ones drain."""
        idle = [w for w in dep.workers if w.ready and not w.draining and w.running == 0]
        booting = [w for w in reversed(dep.workers) if not w.ready] if booting_too else []
        busy = sorted(
            (w for w in dep.workers if w.ready and not w.draining and w.running > 0),
            key=lambda w: (w.running, w.id),
        )
        for w in (idle + booting + busy)[:n]:
            if w.ready:
                dep.ready -= 1
                w.draining = True
                if w.running == 0:
                    self._stop(dep, w, self.now)
            else:
                dep.booting -= 1
                self._stop(dep, w, self.now)

    def scale_to(self, dep: DeploymentRuntime, want: int) -> None:
        if want > dep.capacity:
            self.start(dep, want - dep.capacity)
        elif want < dep.capacity:
            self.release(dep, dep.capacity - want)

    def _stop(self, dep: DeploymentRuntime, w: Worker, at: float) -> None:
        if w.running:  # only at the horizon; requests are never killed
            w.used_s += at - w.busy_since
        self._provisioned_s += at - w.started_at
        self._used_s += w.used_s
        dep.workers.remove(w)
        del self._workers[w.id]
        del self._worker_dep[w.id]

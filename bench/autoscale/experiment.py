"""Which runs make up a benchmark, and running them (in parallel processes, same numbers).

A run is (workload, policy, knob value, T_cold). The main table runs every policy at its
default knob for every T_cold; the Pareto sweep runs each policy's main knob at one T_cold.
Runs are independent and seeded by the workload alone, so the process pool changes only the
wall time, never a number.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from bench.autoscale.metrics import RunResult, summarize
from bench.autoscale.oracle import Oracle
from bench.autoscale.ours import PENALTY_S, Ours
from bench.autoscale.policies import KEDA, KPA, Histogram, KeepAlive, Policy
from bench.autoscale.sim import Sim
from bench.autoscale.workloads import ServiceModel, Workload
from control_plane.domain import scaling
from control_plane.domain.scaling import DeploymentState, ScalingPolicy

Knob = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Settings:
    """One benchmark's settings, built by the entry point and shared by every run."""

    seed: int = 0
    slots: int = 8  # request slots per worker (= the policy's target concurrency)
    service: ServiceModel = field(default_factory=ServiceModel)
    refit_s: float = 10.0  # ours: period of the off-path refit event
    refresh_quiet: bool = True  # ours: refit a quiet deployment before its models expire
    queue_wait_s: float = ScalingPolicy().queue_wait_s  # ours: the deployment setting
    jobs: int = 1  # processes running simulations


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    knob: str  # the knob the Pareto sweep turns
    default: Knob
    sweep: tuple[Knob, ...]  # values for the Pareto sweep (default included)
    make: Callable[[Knob, Settings], Policy]

    def label(self, value: Knob) -> str:
        return f"{self.knob}={'/'.join(f'{v:g}' for v in value)}" if value else "-"


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec(
            "ours",
            "cold_penalty_s",
            (PENALTY_S,),
            tuple((v,) for v in sorted({0.0, 30.0, 100.0, 300.0, 1000.0, PENALTY_S})),
            lambda k, s: Ours(
                k[0],
                refit_s=s.refit_s,
                refresh_quiet=s.refresh_quiet,
                queue_wait_s=s.queue_wait_s,
            ),
        ),
        PolicySpec(
            "keepalive",
            "window_s",
            (600.0,),
            ((60.0,), (180.0,), (600.0,), (1800.0,)),
            lambda k, s: KeepAlive(k[0]),
        ),
        PolicySpec(
            "kpa",
            "stable_window_s",
            (60.0,),
            ((20.0,), (60.0,), (180.0,), (600.0,)),
            lambda k, s: KPA(k[0]),
        ),
        PolicySpec(
            "keda",
            "cooldown_s",
            (300.0,),
            ((30.0,), (120.0,), (300.0,), (900.0,)),
            lambda k, s: KEDA(k[0]),
        ),
        PolicySpec(
            "histogram",
            "percentiles",
            (5.0, 99.0),
            ((1.0, 99.9), (5.0, 99.0), (10.0, 95.0), (25.0, 75.0)),
            lambda k, s: Histogram(k[0], k[1]),
        ),
        PolicySpec("oracle", "", (), ((),), lambda k, s: Oracle()),
    )
}


@dataclass(frozen=True, slots=True)
class RunSpec:
    workload: str
    policy: str
    knob: Knob
    t_cold_s: float
    record_states: bool = False  # ours: keep sampled states for timing decide()


def plan(
    workloads: Iterable[str],
    t_colds: Iterable[float],
    pareto_t_cold_s: float | None,
    record_for: str | None,
) -> list[RunSpec]:
    """The main table (every policy × T_cold at its default) and, unless None, the Pareto
    sweep at `pareto_t_cold_s`. `record_for`: the workload whose default ``ours`` run at
    `pareto_t_cold_s` (or the first T_cold) records states for the decide() timing."""
    t_colds = list(t_colds)
    record_t = pareto_t_cold_s if pareto_t_cold_s in t_colds else t_colds[0]
    specs: list[RunSpec] = []
    for w in workloads:
        for p in POLICIES.values():
            for t in t_colds:
                record = p.name == "ours" and w == record_for and t == record_t
                specs.append(RunSpec(w, p.name, p.default, t, record))
            if pareto_t_cold_s is not None:
                for k in p.sweep:
                    spec = RunSpec(w, p.name, k, pareto_t_cold_s)
                    if k != p.default or pareto_t_cold_s not in t_colds:
                        specs.append(spec)
    return specs


@dataclass(frozen=True, slots=True)
class Outcome:
    spec: RunSpec
    result: RunResult
    states: list[tuple[float, list[DeploymentState]]]  # only for a recording run


def run_one(spec: RunSpec, workload: Workload, settings: Settings) -> Outcome:
    p = POLICIES[spec.policy]
    policy = p.make(spec.knob, settings)
    if spec.record_states and isinstance(policy, Ours):
        policy.record_every = 10
    t0 = time.perf_counter()
    record = Sim(workload, policy, spec.t_cold_s, settings.slots).run()
    wall = time.perf_counter() - t0
    result = summarize(
        record,
        workload=workload.name,
        policy=p.name,
        knob=p.label(spec.knob),
        t_cold_s=spec.t_cold_s,
        num_deployments=len(workload.deployments),
        wall_s=wall,
    )
    states = policy.recorded if isinstance(policy, Ours) else []
    return Outcome(spec, result, states)


_POOL_STATE: dict[str, object] = {}


def _init_pool(workloads: dict[str, Workload], settings: Settings) -> None:
    _POOL_STATE["workloads"] = workloads
    _POOL_STATE["settings"] = settings


def _run_in_pool(spec: RunSpec) -> Outcome:
    workloads = _POOL_STATE["workloads"]
    settings = _POOL_STATE["settings"]
    assert isinstance(workloads, dict) and isinstance(settings, Settings)
    return run_one(spec, workloads[spec.workload], settings)


def run_all(
    specs: list[RunSpec],
    workloads: dict[str, Workload],
    settings: Settings,
    progress: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Every spec, in spec order; the costliest runs go first so the pool stays busy."""
    order = sorted(range(len(specs)), key=lambda i: -_cost(specs[i], workloads[specs[i].workload]))
    done: dict[int, Outcome] = {}
    if settings.jobs <= 1:
        for i in order:
            done[i] = run_one(specs[i], workloads[specs[i].workload], settings)
            if progress:
                progress(done[i])
    else:
        with ProcessPoolExecutor(
            settings.jobs, initializer=_init_pool, initargs=(workloads, settings)
        ) as pool:
            futures = {i: pool.submit(_run_in_pool, specs[i]) for i in order}
            for i in order:
                done[i] = futures[i].result()
                if progress:
                    progress(done[i])
    return [done[i] for i in range(len(specs))]


def _cost(spec: RunSpec, workload: Workload) -> float:
    ticks = len(workload.deployments) * workload.duration_s
    per_tick = {"ours": 10.0, "oracle": 0.0}.get(spec.policy, 1.0)
    return ticks * per_tick + workload.num_requests


def default_jobs() -> int:
    return max(min(os.cpu_count() or 1, 4), 1)


def time_decide(
    states: list[tuple[float, list[DeploymentState]]], num: int = 1000, repeats: int = 5
) -> float:
    """p99 over the recorded ticks of the wall time (ms) of calling decide() on `num`
    deployments' states: each tick's states, repeated to `num`. The ticks are timed in
    `repeats` passes over all of them, and each tick's fastest pass kept, so neither another
    process taking the core nor a slow spell of the machine counts: a shared 2-core VM runs the
    same loop 30-75 % slower for seconds at a time, longer than one tick's repeats back to back
    (timed that way, the p99 was 45-48 ms where spread passes measured 28 ms, in one run)."""
    ticks = [(now, [b[i % len(b)] for i in range(num)]) for now, b in states if b]
    best = [math.inf] * len(ticks)
    for _ in range(repeats):
        for i, (now, tick) in enumerate(ticks):
            t0 = time.perf_counter()
            for s in tick:
                scaling.decide(s, now)
            best[i] = min(best[i], time.perf_counter() - t0)
    times = sorted(best)
    if not times:
        return math.nan
    return times[min(math.ceil(0.99 * len(times)) - 1, len(times) - 1)] * 1000

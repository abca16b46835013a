"""The trace family: the workloads an autoscaler is judged on, by its worst member and its
median, not by one or two traces.

Each member is one deployment drawn by a documented generator (`generators.py`) from a seed;
`--seed` draws the whole family afresh. Members (`members()`; names say the parameters):

- `poisson` (9): rate 0.002 .. 10 calls/s; and 4 calls/s for 17 minutes (a short trace);
- `on_off` (36): burst size 10 / 50 / 200 / 500 × quiet gaps exponential / log-normal / Pareto
  × median gap 20 s / 3 min / 15 min (each gap clipped to 10 s .. 30 min);
- `gap2to4` (3): bursts of 100-300 calls after quiet gaps uniform in 2-4 minutes;
- `periodic` (12): period 1 / 5 / 15 / 30 min × batch 1 / 30 / 200, jitter 2 % or 15 %;
- `diurnal` (6): a sinusoidal rate (a day compressed to 2 h) at a mean of 0.02 / 0.3 / 3
  calls/s; a ramp up and down to 0.5 / 5 calls/s; a daily cycle with a 15-minute one on top;
- `flash` (4): a background of 0.005 .. 1 calls/s with surges to 5 .. 20 calls/s decaying over
  minutes;
- `mixture` (4): sums of the above;
- `mmpp` (3): a rate that jumps among 0 and 1 or 2 calls/s, or 0.01 / 0.5 / 5, after dwells of
  30 s, 2 min or 10 min on average (busy and quiet spells);
- `sessions` (2) and `chains` (2): conversations of 3-30 turns a user's think time apart, and
  agent runs of 5-50 calls one after the other, started as a Poisson stream;
- `hawkes` (2): self-exciting streams (each call brings 0.7-0.9 more soon after it);
- `step` (4): a rate that jumps up or down 16-60× halfway and stays; a stream with two
  20-minute outages;
- `trend` (3): bursts growing from 10 to 400 calls, or shrinking, over the span; batches whose
  period drifts from 4 to 8 minutes;
- `renewal` (2): calls apart by Pareto gaps (tail index 0.9 and 1.1), no burst structure;
- `trace` (2): the two shared traces (`../shared/workloads/`), when present;

and two multi-tenant fleets (`fleets()`): `synthetic` (`workloads.synthetic_workload`, 240
deployments) and `fleet-mix` (240 deployments, each drawn from the generators above with random
parameters). A member spans long enough for about 25 of its cycles (2 h at least, 6 h at most);
80 % of calls are sync (a caller waits). Call lengths follow the Azure conversation trace's
(lognormal) before `workloads.ServiceModel` turns them into service times.

Floors, per member (`wake_floor`): the calls that come within T_cold of a wake, a call that
finds the deployment idle for longer than a window (its first call always). With an infinite
window that is `bound.cold_floor` (no policy but the oracle avoids those); with 30 min, the
calls no keep-alive compared here avoids, and no causal policy avoids without a pattern to
pre-warm on.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.autoscale import generators as gen
from bench.autoscale.workloads import (
    TRACE_SYNC_SHARE,
    Deployment,
    Request,
    ServiceModel,
    Workload,
    _lengths,
    synthetic_workload,
    trace_workload,
)
from bench.traces import WORKLOADS

HOUR_S = 3600.0
MIN_SPAN_S, MAX_SPAN_S = 2 * HOUR_S, 6 * HOUR_S
CYCLES = 25  # a member spans about this many of its cycles (gaps, periods), within the bounds
FLEET_SIZE = 240
FLEET_SPAN_S = 2 * HOUR_S
TRACES = ("azure_llm_2023_conv.csv", "mooncake_conversation.jsonl")
# The longest keep-alive compared: a call after a longer idle time is cold under all of them.
LONGEST_KEEPALIVE_S = 1800.0

Make = Callable[..., list[float]]  # (rng, duration_s=...) → arrival times


@dataclass(frozen=True, slots=True)
class MemberSpec:
    name: str
    generator: str  # the generator's family name (`poisson`, `on_off`, ...)
    span_s: float  # arrivals lie in [0, span_s]
    make: Make  # (seeded rng, duration_s=span) → arrival times


def span_for(cycle_s: float) -> float:
    return min(max(CYCLES * cycle_s, MIN_SPAN_S), MAX_SPAN_S)


def member_specs() -> list[MemberSpec]:
    """The single-deployment generated members, in a fixed order."""
    out: list[MemberSpec] = []
    for rate in (0.002, 0.005, 0.02, 0.05, 0.2, 1.0, 4.0, 10.0):
        out.append(
            MemberSpec(
                f"poisson-{rate:g}rps",
                "poisson",
                span_for(40 / rate / CYCLES),
                functools.partial(gen.poisson, rate=rate),
            )
        )
    out.append(
        MemberSpec(
            "poisson-4rps-17min", "poisson", 1020.0, functools.partial(gen.poisson, rate=4.0)
        )
    )
    for size in (10, 50, 200, 500):
        for dist in ("exponential", "lognormal", "pareto"):
            for median in (20.0, 180.0, 900.0):
                out.append(
                    MemberSpec(
                        f"on_off-{size}x-{dist}-{_dur(median)}",
                        "on_off",
                        span_for(median + size / 6),
                        functools.partial(
                            gen.on_off, size=size, distribution=dist, median_gap_s=median
                        ),
                    )
                )
    for k in range(3):
        out.append(
            MemberSpec(
                f"gap2to4-{k}",
                "gap2to4",
                span_for(180.0 + 20.0),
                functools.partial(
                    gen.on_off,
                    size=200,
                    distribution="uniform",
                    median_gap_s=180.0,
                    exact_size=(100, 300),
                ),
            )
        )
    for i, period in enumerate((60.0, 300.0, 900.0, 1800.0)):
        for j, batch in enumerate((1, 30, 200)):
            jitter = 0.02 if (i + j) % 2 == 0 else 0.15
            out.append(
                MemberSpec(
                    f"periodic-{_dur(period)}x{batch}-j{jitter:g}",
                    "periodic",
                    span_for(period),
                    functools.partial(gen.periodic, period_s=period, batch=batch, jitter=jitter),
                )
            )
    for mean in (0.02, 0.3, 3.0):
        out.append(
            MemberSpec(
                f"diurnal-{mean:g}rps",
                "diurnal",
                2 * MIN_SPAN_S,
                functools.partial(gen.diurnal, mean_rate=mean, amplitude=0.9, period_s=MIN_SPAN_S),
            )
        )
    for peak in (0.5, 5.0):
        out.append(
            MemberSpec(
                f"ramp-{peak:g}rps",
                "diurnal",
                MIN_SPAN_S,
                functools.partial(gen.ramp, peak_rate=peak),
            )
        )
    for background, peak in ((0.005, 5.0), (0.005, 20.0), (0.2, 10.0), (1.0, 20.0)):
        out.append(
            MemberSpec(
                f"flash-{background:g}rps-to-{peak:g}rps",
                "flash",
                3 * HOUR_S,
                functools.partial(
                    gen.flash_crowd, background=background, peak=peak, surges=2, decay_s=240.0
                ),
            )
        )
    out += _mixtures()
    out += _more_shapes()
    return out


def _more_shapes() -> list[MemberSpec]:
    """Shapes beyond bursts, batches and cycles: spells, conversations, agent runs,
    self-excitation, steps, trends, drift and heavy-tailed renewals."""
    span, long = 3 * HOUR_S, 4 * HOUR_S
    shapes: list[tuple[str, str, float, Make, dict[str, object]]] = [
        ("mmpp-0-1rps-30s", "mmpp", span, gen.markov_modulated,
         {"rates": (0.0, 1.0), "dwell_s": 30.0}),
        ("mmpp-0-2rps-2min", "mmpp", span, gen.markov_modulated,
         {"rates": (0.0, 2.0), "dwell_s": 120.0}),
        ("mmpp-0.01-0.5-5rps-10min", "mmpp", long, gen.markov_modulated,
         {"rates": (0.01, 0.5, 5.0), "dwell_s": 600.0}),
        ("sessions-0.003-think20s", "sessions", long, gen.runs,
         {"start_rate": 0.003, "length": (5, 30), "step_s": 20.0, "spread": 0.7}),
        ("sessions-0.05-think60s", "sessions", span, gen.runs,
         {"start_rate": 0.05, "length": (3, 15), "step_s": 60.0, "spread": 0.7}),
        ("chains-0.005-x10to50", "chains", long, gen.runs,
         {"start_rate": 0.005, "length": (10, 50), "step_s": 6.0, "spread": 0.3}),
        ("chains-0.05-x5to20", "chains", span, gen.runs,
         {"start_rate": 0.05, "length": (5, 20), "step_s": 6.0, "spread": 0.3}),
        ("hawkes-0.002-b0.9-30s", "hawkes", long, gen.self_exciting,
         {"base_rate": 0.002, "branching": 0.9, "decay_s": 30.0}),
        ("hawkes-0.02-b0.7-5s", "hawkes", span, gen.self_exciting,
         {"base_rate": 0.02, "branching": 0.7, "decay_s": 5.0}),
        ("step-0.05-to-3rps", "step", span, gen.step,
         {"before": 0.05, "after": 3.0, "at_share": 0.5}),
        ("step-3-to-0.05rps", "step", span, gen.step,
         {"before": 3.0, "after": 0.05, "at_share": 0.5}),
        ("step-0.5-to-8rps", "step", span, gen.step,
         {"before": 0.5, "after": 8.0, "at_share": 0.5}),
        ("outages-2rps-2x20min", "step", span, gen.with_outages,
         {"rate": 2.0, "outages": 2, "outage_s": 1200.0}),
        ("trend-bursts-10-to-400-2min", "trend", long, gen.trending_bursts,
         {"size_from": 10, "size_to": 400, "median_gap_s": 120.0}),
        ("trend-bursts-400-to-10-2min", "trend", long, gen.trending_bursts,
         {"size_from": 400, "size_to": 10, "median_gap_s": 120.0}),
        ("drift-periodic-4-to-8min-x50", "trend", long, gen.drifting_periodic,
         {"period_from": 240.0, "period_to": 480.0, "batch": 50}),
        ("renewal-pareto-20s-a1.1", "renewal", long, gen.renewal,
         {"scale_s": 20.0, "alpha": 1.1}),
        ("renewal-pareto-2s-a0.9", "renewal", long, gen.renewal,
         {"scale_s": 2.0, "alpha": 0.9}),
        ("two-cycles-1rps", "diurnal", long, gen.two_cycles,
         {"mean_rate": 1.0, "period_s": 2 * HOUR_S, "inner_period_s": 900.0}),
    ]  # fmt: skip
    return [MemberSpec(n, g, d, functools.partial(f, **kw)) for n, g, d, f, kw in shapes]


def _mixtures() -> list[MemberSpec]:
    span = 3 * HOUR_S

    def a(r: random.Random, duration_s: float) -> list[float]:
        d = duration_s
        return gen.superpose([gen.poisson(r, 0.05, d), gen.on_off(r, 200, "lognormal", 180, d)])

    def b(r: random.Random, duration_s: float) -> list[float]:
        d = duration_s
        return gen.superpose([gen.periodic(r, 300, 30, 0.02, d), gen.poisson(r, 0.2, d)])

    def c(r: random.Random, duration_s: float) -> list[float]:
        d = duration_s
        return gen.superpose(
            [gen.diurnal(r, 0.3, 0.9, MIN_SPAN_S, d), gen.flash_crowd(r, 0.0, 20.0, 2, 240, d)]
        )

    def e(r: random.Random, duration_s: float) -> list[float]:
        d = duration_s
        return gen.superpose(
            [gen.on_off(r, 10, "exponential", 20, d), gen.on_off(r, 500, "pareto", 900, d)]
        )

    return [
        MemberSpec("mix-poisson0.05+bursts200-lognormal-3min", "mixture", span, a),
        MemberSpec("mix-cron5minx30+poisson0.2", "mixture", span, b),
        MemberSpec("mix-diurnal0.3+flash20", "mixture", span, c),
        MemberSpec("mix-bursts10-20s+bursts500-pareto-15min", "mixture", span, e),
    ]


def _dur(s: float) -> str:
    return f"{s / 60:g}min" if s >= 60 else f"{s:g}s"


def build(spec: MemberSpec, seed: int, service: ServiceModel) -> Workload:
    """One member as a one-deployment workload, drawn from `seed` and the member's name."""
    rng = random.Random(f"{seed}:{spec.name}")
    times = sorted(spec.make(rng, duration_s=spec.span_s))
    requests = tuple(
        Request(t, service.service_s(*_lengths(rng)), rng.random() < TRACE_SYNC_SHARE)
        for t in times
    )
    if not requests:  # a very sparse member may draw nothing: one call in the middle
        requests = (Request(spec.span_s / 2, service.service_s(*_lengths(rng)), True),)
    what = f"{spec.generator}: {len(requests)} calls over {spec.span_s:.0f} s"
    return Workload(
        spec.name, (Deployment(spec.name, spec.generator, requests),), spec.span_s, what
    )


def members(
    seed: int, service: ServiceModel, names: set[str] | None = None, traces: bool = True
) -> dict[str, Workload]:
    """The single-deployment members (`names`: only those), the shared traces included when
    present."""
    out = {s.name: build(s, seed, service) for s in member_specs() if not names or s.name in names}
    if traces:
        for t in TRACES:
            path = WORKLOADS / t
            stem = path.stem
            if path.exists() and (not names or stem in names):
                out[stem] = trace_workload(path, service, seed)
    return out


def fleets(
    seed: int, service: ServiceModel, size: int = FLEET_SIZE, span_s: float = FLEET_SPAN_S
) -> dict[str, Workload]:
    """The two multi-tenant fleets."""
    return {
        "synthetic": synthetic_workload(seed, service, size),
        "fleet-mix": fleet_mix(seed, service, size, span_s),
    }


# Shares of the generators in the mixed fleet: most of a real fleet is sparse (ATC'20).
FLEET_SHARES = (
    ("poisson", 0.40),
    ("on_off", 0.20),
    ("periodic", 0.15),
    ("diurnal", 0.15),
    ("flash", 0.05),
    ("mixture", 0.05),
)


def fleet_mix(seed: int, service: ServiceModel, size: int, span_s: float) -> Workload:
    """`size` deployments over `span_s`, each from a generator drawn by FLEET_SHARES with
    parameters drawn over the family's ranges (log-uniform where they span decades)."""
    rng = random.Random(f"{seed}:fleet-mix")
    kinds = [k for k, _ in FLEET_SHARES]
    deployments: list[Deployment] = []
    drawn = dict.fromkeys(kinds, 0)
    for i in range(size):
        kind = rng.choices(kinds, [w for _, w in FLEET_SHARES])[0]
        sub = random.Random(rng.getrandbits(64))
        times = sorted(_fleet_arrivals(kind, sub, drawn[kind], span_s))
        drawn[kind] += 1
        requests = tuple(
            Request(t, service.service_s(*_lengths(sub)), sub.random() < TRACE_SYNC_SHARE)
            for t in times
        )
        deployments.append(Deployment(f"{kind}-{i:03d}", kind, requests))
    total = sum(len(d.requests) for d in deployments)
    what = f"{size} deployments from the family's generators, {total} calls over {span_s:.0f} s"
    return Workload("fleet-mix", tuple(deployments), span_s, what)


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _fleet_arrivals(kind: str, r: random.Random, rank: int, d: float) -> list[float]:
    if kind == "poisson":
        return gen.poisson(r, 1 / _log_uniform(r, 60.0, 3600.0), d)
    if kind == "on_off":
        dist = r.choice(("exponential", "lognormal", "pareto"))
        return gen.on_off(r, _log_uniform(r, 10, 300), dist, _log_uniform(r, 60, 1800), d)
    if kind == "periodic":
        period = _log_uniform(r, 60.0, 1800.0)
        return gen.periodic(r, period, r.choice((1, 1, 3, 30, 200)), r.uniform(0, 0.15), d)
    if kind == "diurnal":  # a few carry most of the fleet's calls (Zipf over their rank)
        mean = 3.0 / math.pow(rank + 1, 1.2) * r.lognormvariate(0.0, 0.3)
        return gen.diurnal(r, mean, r.uniform(0.5, 0.95), MIN_SPAN_S, d)
    if kind == "flash":
        peak = _log_uniform(r, 2.0, 20.0)
        return gen.flash_crowd(r, _log_uniform(r, 0.001, 0.1), peak, r.randint(1, 2), 240.0, d)
    return gen.superpose(
        [
            gen.poisson(r, 1 / _log_uniform(r, 60.0, 1800.0), d),
            gen.on_off(r, _log_uniform(r, 10, 300), "lognormal", _log_uniform(r, 60, 1800), d),
        ]
    )


def wake_floor(workload: Workload, t_cold_s: float, idle_s: float = math.inf) -> int:
    """Calls within `t_cold_s` of a wake: a deployment's first call, or a call that finds every
    earlier call of its deployment finished at least `idle_s` ago. Cold under any policy that
    keeps no worker longer than `idle_s` after its work and does not boot ahead of a call."""
    count = 0
    for d in workload.deployments:
        busy_until = -math.inf
        woke_at = -math.inf
        for r in d.requests:
            if r.arrival_s - busy_until >= idle_s or busy_until == -math.inf:
                woke_at = r.arrival_s
            if r.arrival_s < woke_at + t_cold_s:
                count += 1
            busy_until = max(busy_until, r.arrival_s + r.service_s)
    return count

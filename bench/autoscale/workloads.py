"""Workloads for the autoscaler simulator: real traces and a seeded synthetic fleet.

A workload is a set of deployments, each a time-sorted list of requests whose service time is
already fixed (``ServiceModel``), so every policy replays exactly the same work.

- ``trace_workload(path)``: any trace ``bench.traces.read_trace`` reads (Azure CSV, Mooncake
  JSONL) as one deployment; requests are sync or async by a seeded 80/20 draw.
- ``synthetic_workload(seed)``: ≥ 200 deployments over one hour, four kinds (``KINDS``), with
  the heavy-tailed shape of a real fleet (Azure Functions, ATC'20: most applications are called
  less than once a minute, a few carry most of the traffic).

Example:

    >>> w = synthetic_workload(seed=1, num_deployments=200)
    >>> len(w.deployments), w.duration_s
    (200, 3600.0)
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from pathlib import Path

from bench.traces import clip, read_trace

HOUR_S = 3600.0
KINDS = ("sparse", "periodic", "diurnal", "bursty")
# Share of each kind in the synthetic fleet.
KIND_SHARES = {"sparse": 0.45, "periodic": 0.2, "diurnal": 0.2, "bursty": 0.15}
# Trace requests: this share is sync (a caller waits), the rest async (a queued job).
TRACE_SYNC_SHARE = 0.8
# Bursty deployments must be far burstier than Poisson (CV 1): inter-arrival CV above this.
MIN_BURSTY_CV = 10.0


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """How trace lengths become a request's service time on one worker slot.

    Lengths are scaled as ``bench/engine.py`` scales them to the CPU engine; the rates are that
    engine's measured numbers (docs/benchmarks.md, "Engine": 226 tok/s aggregate output at 32
    concurrent requests, ITL p50 54 ms). The prefill rate is an estimate from the same run: its
    3,327 prompt tokens were all prefilled by the TTFT p99 of 2.78 s, ~1,200 tok/s."""

    prompt_div: float = 8.0
    prompt_min: int = 16
    prompt_max: int = 512
    output_div: float = 2.0
    output_min: int = 16
    output_max: int = 256
    prefill_tok_s: float = 1200.0  # prompt tokens per second of one request
    decode_s_per_token: float = 0.054  # seconds per output token of one request (ITL)

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        num_prompt = clip(prompt_tokens / self.prompt_div, self.prompt_min, self.prompt_max)
        num_out = clip(output_tokens / self.output_div, self.output_min, self.output_max)
        return num_prompt / self.prefill_tok_s + num_out * self.decode_s_per_token

    def describe(self) -> str:
        return (
            f"prompt = ctx/{self.prompt_div:g} clipped to {self.prompt_min}..{self.prompt_max}, "
            f"output = gen/{self.output_div:g} clipped to {self.output_min}..{self.output_max}; "
            f"service = prompt / {self.prefill_tok_s:g} tok/s + output × "
            f"{self.decode_s_per_token * 1000:g} ms"
        )


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float  # seconds from the workload's start
    service_s: float  # seconds the request holds one worker slot
    sync: bool  # True: a caller waits on it; False: an async job


@dataclass(frozen=True, slots=True)
class Deployment:
    name: str
    kind: str  # "trace" or one of KINDS
    requests: tuple[Request, ...]  # NOTE: sorted by arrival_s


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    deployments: tuple[Deployment, ...]
    duration_s: float  # arrivals lie in [0, duration_s]
    description: str

    @property
    def num_requests(self) -> int:
        return sum(len(d.requests) for d in self.deployments)


def trace_workload(
    path: Path, service: ServiceModel, seed: int, limit: int | None = None
) -> Workload:
    """The trace's first `limit` requests (all: None) as one deployment."""
    rng = random.Random(f"{seed}:{Path(path).name}")
    requests = tuple(
        Request(r.arrival_s, service.service_s(r.prompt_tokens, r.output_tokens), _sync(rng))
        for r in sorted(read_trace(path, limit=limit), key=lambda r: r.arrival_s)
    )
    if not requests:
        raise ValueError(f"{path}: no requests")
    name = Path(path).stem
    duration = requests[-1].arrival_s
    rate = len(requests) / max(duration, 1.0)
    what = f"{len(requests)} requests over {duration:.0f} s ({rate:.2f} req/s), one deployment"
    return Workload(name, (Deployment(name, "trace", requests),), duration, what)


def _sync(rng: random.Random) -> bool:
    return rng.random() < TRACE_SYNC_SHARE


# synthetic fleet -------------------------------------------------------------------------------


def synthetic_workload(
    seed: int, service: ServiceModel | None = None, num_deployments: int = 240
) -> Workload:
    """A fleet over one hour. Kinds and their shapes:

    - sparse: Poisson, mean gap log-uniform in 2..60 min (sync: someone's chat app);
    - periodic: cron-like, period log-uniform in 1..30 min, jitter up to 5 % of it, 1–4 requests
      per firing (async: scheduled jobs);
    - diurnal: a smooth rate cycle compressed to one hour; mean rates Zipf-distributed over the
      deployments (rank k: 3 / k^1.2 req/s), so a few carry most of the fleet's traffic (sync);
    - bursty: on/off; bursts of 60–300 requests at 1–5 req/s, off periods exponential with a
      mean of 5–20 min, inter-arrival CV > 10 (half are batch jobs, async).
    Lengths follow the Azure conversation trace's (lognormal; context p50 1,020, p99 ~4,100;
    output p50 129, p99 ~600) before the service model scales them."""
    service = service or ServiceModel()
    rng = random.Random(seed)
    counts = {k: round(num_deployments * s) for k, s in KIND_SHARES.items()}
    counts["sparse"] += num_deployments - sum(counts.values())
    deployments: list[Deployment] = []
    for kind in KINDS:
        for i in range(counts[kind]):
            sub = random.Random(rng.getrandbits(64))
            times, sync = _ARRIVALS[kind](sub, i)
            requests = tuple(
                Request(t, service.service_s(*_lengths(sub)), sync) for t in sorted(times)
            )
            deployments.append(Deployment(f"{kind}-{i:03d}", kind, requests))
    total = sum(len(d.requests) for d in deployments)
    heavy = sorted((len(d.requests) for d in deployments), reverse=True)
    top = sum(heavy[: max(len(heavy) // 20, 1)]) / max(total, 1)
    what = (
        f"{len(deployments)} deployments ("
        + ", ".join(f"{counts[k]} {k}" for k in KINDS)
        + f"), {total} requests over {HOUR_S:.0f} s; the top 5 % of deployments carry "
        f"{top:.0%} of requests"
    )
    return Workload("synthetic", tuple(deployments), HOUR_S, what)


def _lengths(rng: random.Random) -> tuple[int, int]:
    prompt = rng.lognormvariate(math.log(1020), 0.60)
    output = rng.lognormvariate(math.log(129), 0.66)
    return max(int(prompt), 1), max(int(output), 1)


def _sparse(rng: random.Random, _rank: int) -> tuple[list[float], bool]:
    mean_gap = math.exp(rng.uniform(math.log(120), math.log(3600)))
    return _poisson(rng, 0.0, HOUR_S, 1 / mean_gap), True


def _periodic(rng: random.Random, _rank: int) -> tuple[list[float], bool]:
    period = math.exp(rng.uniform(math.log(60), math.log(1800)))
    jitter = rng.uniform(0.0, 0.05) * period
    per_firing = rng.randint(1, 4)
    times: list[float] = []
    t = rng.uniform(0.0, period)
    while t < HOUR_S:
        fire = t + rng.uniform(-jitter, jitter)
        times += [min(max(fire + 0.2 * j, 0.0), HOUR_S) for j in range(per_firing)]
        t += period
    return times, False


def _diurnal(rng: random.Random, rank: int) -> tuple[list[float], bool]:
    mean_rate = 3.0 / math.pow(rank + 1, 1.2) * rng.lognormvariate(0.0, 0.3)
    amplitude = rng.uniform(0.5, 0.9)
    phase = rng.uniform(0.0, 2 * math.pi)
    peak = mean_rate * (1 + amplitude)

    def rate(t: float) -> float:
        return mean_rate * (1 + amplitude * math.sin(2 * math.pi * t / HOUR_S + phase))

    # thinning: a Poisson stream at the peak rate, each arrival kept with rate(t) / peak
    return [t for t in _poisson(rng, 0.0, HOUR_S, peak) if rng.random() * peak < rate(t)], True


def _bursty(rng: random.Random, _rank: int) -> tuple[list[float], bool]:
    sync = rng.random() < 0.5
    mean_off = rng.uniform(300, 1200)
    for _ in range(100):  # redraw until the stream is bursty enough (rarely more than once)
        times: list[float] = []
        t = rng.expovariate(1 / mean_off)
        while t < HOUR_S:
            size = rng.randint(60, 300)
            rate = rng.uniform(1.0, 5.0)
            for _ in range(size):
                t += rng.expovariate(rate)
                times.append(t)
            t += rng.expovariate(1 / mean_off)
        times = [x for x in times if x <= HOUR_S]
        if interarrival_cv(times) > MIN_BURSTY_CV:
            return times, sync
    raise AssertionError("no bursty stream drawn")  # unreachable with these parameters


def interarrival_cv(times: list[float]) -> float:
    """Coefficient of variation of the gaps between sorted arrival times (0 if < 2 gaps)."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if len(gaps) < 2:
        return 0.0
    mean = sum(gaps) / len(gaps)
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    return math.sqrt(var) / mean if mean > 0 else 0.0


def _poisson(rng: random.Random, start: float, end: float, rate: float) -> list[float]:
    times: list[float] = []
    t = start
    while rate > 0:
        t += rng.expovariate(rate)
        if t > end:
            break
        times.append(t)
    return times


_ARRIVALS = {"sparse": _sparse, "periodic": _periodic, "diurnal": _diurnal, "bursty": _bursty}

"""The worker's own Prometheus metrics, served on the address its provider chose.

    engine thread   request_admitted: prompt tokens; step_outputs: generated tokens and, as a
                    request finishes, its time to first token, every gap between its tokens,
                    its engine latency and finish reason
    lifecycle       state_entered: cold-start phase durations (boot, load, warm);
                    model_loaded: loader bytes, seconds, throughput, cache-tier hits
    at each scrape  KV-cache usage, requests running and waiting, preemptions, prefix-cache
                    tokens queried and hit: read from the engine (`_EngineCollector`)

The families live in a registry of this object's (not prometheus_client's global one), served
by `serve` on its own thread. They carry no worker or deployment labels: Prometheus adds them
as target labels from the control plane's service discovery (`GET /metrics/workers`). Nothing
here sees a prompt or an output, only counts and times.

>>> metrics = WorkerMetrics(process_started_at())
>>> metrics.serve("127.0.0.1", 9400)  # '127.0.0.1:9400', for the heartbeat
>>> loop = EngineLoop(engine, r, 0.2, on_finished, observer=metrics)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.protocol import WorkerState

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from loader import LoadMetrics
    from worker.engine.outputs import RequestOutput
    from worker.runtime.batching import Combiner
    from worker.runtime.serving import ServingEngine

log = logging.getLogger(__name__)

disable_created_metrics()  # type: ignore[no-untyped-call]  # no `*_created` series

# Engine latencies: a GPU decode step (ms) to a long prefill on a busy CPU (a minute).
LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)

# The start-up phase a worker is in while in each state (the billing phases' names).
STARTUP_PHASES = {WorkerState.BOOTING: "boot", WorkerState.LOADING: "load",
                  WorkerState.WARMING: "warm"}  # fmt: skip
# A phase is complete when the worker goes on to one of these (not when it fails or stops).
_MOVED_ON = frozenset({WorkerState.LOADING, WorkerState.WARMING, WorkerState.IDLE})


class PhaseClock:
    """Pure: the start-up phases a worker completes, from the states it enters.

    >>> clock = PhaseClock(started_at=0.0)
    >>> clock.enter(WorkerState.LOADING, 1.5)
    ('boot', 1.5)
    """

    def __init__(self, started_at: float) -> None:
        self._state = WorkerState.BOOTING  # a process starts booting
        self._since = started_at

    def enter(self, state: WorkerState, now: float) -> tuple[str, float] | None:
        """(phase, seconds) of the phase `state` completes, or None."""
        if state is self._state:
            return None
        phase = STARTUP_PHASES.get(self._state)
        done = (phase, max(now - self._since, 0.0)) if phase and state in _MOVED_ON else None
        self._state, self._since = state, now
        return done


def process_started_at() -> float:
    """This process's start on the `time.monotonic()` clock (Linux: from /proc, so a boot
    counts the interpreter's own start and imports); elsewhere, now."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - start_s
        return time.monotonic() - max(age_s, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()


class WorkerMetrics:
    """The families of one worker process (see the module doc)."""

    def __init__(self, started_at: float) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.engine: ServingEngine | None = None  # set once built; read at each scrape
        self._phases = PhaseClock(started_at)
        self._server: WSGIServer | None = None
        self.prompt_tokens = Counter(
            "platform_worker_prompt_tokens_total",
            "Prompt tokens of the requests admitted to the engine.",
            registry=r,
        )
        self.generation_tokens = Counter(
            "platform_worker_generation_tokens_total", "Tokens generated.", registry=r
        )
        self.finished = Counter(
            "platform_worker_requests_finished_total",
            "Requests the engine finished, by finish reason (stop, length, abort).",
            ["finish_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "platform_worker_time_to_first_token_seconds",
            "Engine arrival to first token, per request.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            "platform_worker_inter_token_latency_seconds",
            "Gap between consecutive tokens of a request (every gap).",
            buckets=ITL_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "platform_worker_request_latency_seconds",
            "Engine arrival to finish, per request.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.phase_s = Gauge(
            "platform_worker_cold_start_phase_seconds",
            "Seconds this worker spent in each start-up phase it completed (boot: from the "
            "process start).",
            ["phase"],
            registry=r,
        )
        self.loaded_bytes = Counter(
            "platform_worker_loaded_bytes_total",
            "Weight bytes the loader put in place (fetched, or mapped from the host tier).",
            registry=r,
        )
        self.load_s = Gauge(
            "platform_worker_load_duration_seconds", "Wall time of the weight load.", registry=r
        )
        self.load_throughput = Gauge(
            "platform_worker_load_throughput_bytes_per_second",
            "Weight bytes per second of the load.",
            registry=r,
        )
        self.load_phase_s = Gauge(
            "platform_worker_load_phase_seconds",
            "Seconds of each loader phase (header, fetch, copy, finish).",
            ["phase"],
            registry=r,
        )
        self.tier_hits = Counter(
            "platform_worker_load_cache_hits_total",
            "Weight objects read from a cache tier instead of storage, by tier.",
            ["tier"],
            registry=r,
        )
        # claims and reports to the control plane (batching.Combiner, by call): read at a scrape
        self.combiners: dict[str, Combiner[Any, Any]] = {}
        r.register(_EngineCollector(self))
        r.register(_ControlCollector(self))
        ProcessCollector(registry=r)  # the worker's memory and CPU

    # engine thread ----------------------------------------------------------------------------

    def request_admitted(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)

    def step_outputs(self, outputs: Sequence[RequestOutput]) -> None:
        generated = 0
        for out in outputs:
            generated += len(out.new_token_ids)
            if not out.finished:
                continue
            self.finished.labels(out.finish_reason or "unknown").inc()
            m = out.metrics
            if m is None:
                continue
            if m.ttft_s is not None:
                self.ttft.observe(m.ttft_s)
            for gap in m.inter_token_latencies_s:
                self.itl.observe(gap)
            self.e2e.observe(max(m.finished_time - m.arrival_time, 0.0))
        if generated:
            self.generation_tokens.inc(generated)

    # lifecycle --------------------------------------------------------------------------------

    def state_entered(self, state: WorkerState, now: float | None = None) -> None:
        done = self._phases.enter(state, time.monotonic() if now is None else now)
        if done is not None:
            self.phase_s.labels(done[0]).set(done[1])

    def model_loaded(self, m: LoadMetrics) -> None:
        self.loaded_bytes.inc(m.bytes_total)
        self.load_s.set(m.seconds)
        self.load_throughput.set(m.bytes_total / m.seconds if m.seconds > 0 else 0.0)
        for phase, seconds in m.phases_s.items():
            self.load_phase_s.labels(phase).set(seconds)
        for tier, hits in m.tier_hits.items():
            self.tier_hits.labels(tier).inc(hits)

    # serving ----------------------------------------------------------------------------------

    def serve(self, host: str, port: int | None) -> str | None:
        """Serve the families over HTTP on `host`:`port` (if the port was taken meanwhile, on
        any free one) from a daemon thread; the address bound, as Prometheus' target. None:
        no port given, or none could be bound (logged: a worker serves jobs without metrics
        rather than not at all)."""
        if port is None:
            return None
        try:
            try:
                server, _ = start_http_server(port, host, registry=self.registry)
            except OSError as exc:
                if port == 0:
                    raise
                log.warning("metrics port %d unavailable (%s): serving on a free one", port, exc)
                server, _ = start_http_server(0, host, registry=self.registry)
        except OSError as exc:
            log.warning("no /metrics served on %s: %s", host, exc)
            return None
        self._server = server
        shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
        shown = f"[{shown}]" if ":" in shown else shown  # an IPv6 address
        return f"{shown}:{server.server_port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _ControlCollector(Collector):
    """The worker's requests to the control plane, and the jobs they carried: the ratio is
    how many claims (or reports) went together per request."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "platform_worker_control_requests",
            "Claims and completion reports sent to the control plane, by call (one request "
            "carries the jobs that waited together).",
            labels=["call"],
        )
        jobs = CounterMetricFamily(
            "platform_worker_control_jobs",
            "Jobs those requests carried, by call.",
            labels=["call"],
        )
        for call, combiner in self._metrics.combiners.items():
            n_requests, n_jobs = combiner.sent
            requests.add_metric([call], n_requests)
            jobs.add_metric([call], n_jobs)
        yield requests
        yield jobs


class _EngineCollector(Collector):
    """The engine's queues and caches, read when Prometheus scrapes.

    NOTE: runs on the HTTP thread while the engine thread steps; it only reads counters and
    list lengths (atomic under the GIL), so a scrape sees a state at most one step apart."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        engine = self._metrics.engine
        if engine is None:
            return
        stats = engine.stats()
        yield GaugeMetricFamily(
            "platform_worker_kv_cache_usage_ratio",
            "Share of the KV-cache blocks held by requests.",
            value=stats.kv_cache_usage,
        )
        yield GaugeMetricFamily(
            "platform_worker_kv_cache_blocks",
            "KV-cache blocks in all (of cache.block_size tokens each).",
            value=engine.cache.num_blocks,
        )
        yield GaugeMetricFamily(
            "platform_worker_requests_running",
            "Requests holding KV blocks.",
            value=stats.num_running,
        )
        yield GaugeMetricFamily(
            "platform_worker_requests_waiting",
            "Requests queued or preempted.",
            value=stats.num_waiting,
        )
        yield CounterMetricFamily(
            "platform_worker_preemptions",
            "Requests that lost their KV cache to make room (recomputed later).",
            value=stats.num_preemptions,
        )
        prefix = stats.prefix_cache
        yield CounterMetricFamily(
            "platform_worker_prefix_cache_query_tokens",
            "Prompt tokens looked up in the prefix cache at admission.",
            value=prefix.queries,
        )
        yield CounterMetricFamily(
            "platform_worker_prefix_cache_hit_tokens",
            "Of those, tokens found cached (hit rate: the ratio of the two rates).",
            value=prefix.hits,
        )
        yield GaugeMetricFamily(
            "platform_worker_prefix_cache_hit_ratio",
            "Tokens found cached / tokens looked up, since the worker started.",
            value=prefix.hit_rate,
        )

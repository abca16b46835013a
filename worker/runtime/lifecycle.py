"""Worker lifecycle: boot → load → warm → serve (idle ⇄ busy) → drain → stopped.

The warm-up (one short generation) is skipped when wake-ups already wait in the deployment's
queue: on a cold start the waiting job would pay for both the warm-up and its own first pass.

A warm-pool worker (no assignment at start) boots — imports the runtime and its engine's
(vLLM's for `--engine vllm`), initialises the device — reports `idle` with no deployment, and
waits for its one assignment (warm_pool.py: one on another engine fails it); then it loads,
warms and serves like any other. It never goes back to the pool: a worker that served a
tenant holds nothing for the next one.

Each transition is reported to the control plane (it closes a billing segment), except BUSY
and IDLE, which it derives from the claims and job ends itself; a heartbeat
in Redis tells the reconciler the worker is alive. SIGTERM means drain: stop taking work,
finish the jobs in hand, report `stopped`, finish a cache-tier fill still pending (bounded: the
next worker's hit), exit 0. SIGINT, or a second signal, is the same without the fill.

Serving holds up to ``max_concurrency`` jobs at once in one continuous-batching engine:

    consumer thread (Redis)    claim pool (HTTP)          engine thread
    ───────────────────────    ─────────────────          ─────────────
    delivery ──────────────▶  claim, parse, validate ──▶  engine.add_request, step,
                               (invalid: report failed)    XADD deltas, cancel/timeouts
    ack  ◀──── delivery.ack ◀─ complete (HTTP) ◀────────  finished job
    (on its own thread)

The job path (claim, check, report, ack) is the runtime's `JobFlow` (jobs.py); claims that
wait at the same time go in one request, and so do reports (batching.py).

The worker is BUSY while it holds at least one claimed job, IDLE otherwise.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from common import logs
from common.messages import Assignment
from common.protocol import (
    HEARTBEAT_HOST_FIELD,
    HEARTBEAT_HOST_TIER_FIELD,
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_JOBS_FIELD,
    HEARTBEAT_METRICS_FIELD,
    HEARTBEAT_PROGRESS_FIELD,
    HEARTBEAT_TTL_S,
    PROGRESS_BEAT_S,
    WorkerState,
    worker_handoffs_key,
    worker_heartbeat_key,
)
from common.reasons import bounded_reason
from common.signals import on_signals
from worker.runtime import engine_setup, warm_pool
from worker.runtime.broker import jobs_waiting
from worker.runtime.consumer import consume
from worker.runtime.control_client import ControlClient
from worker.runtime.jobs import JobFlow
from worker.runtime.metrics import WorkerMetrics, process_started_at
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from loader import Progress, TierFill
    from worker.runtime.engine_loop import EngineLoop
    from worker.runtime.serving import ServingEngine

log = logging.getLogger(__name__)


# Each of the worker's own Redis commands (heartbeat, output deltas, cancel polls, the pool's
# BLPOP: warm_pool.py) gets this long for an answer, and one more try on a fresh connection. A
# connection that stops answering without closing (a partition, a lost NAT entry) must cost a
# heartbeat or two, not the worker (HEARTBEAT_TTL_S), nor stall the engine thread. NOTE:
# redis-py's defaults differ by version: < 6 waits forever, 6+ 5 s and 10 retries (a minute).
REDIS_TIMEOUT_S = 3.0
# The cache-tier fill starts this long after the worker is ready, once no job is in flight
# (the jobs that waited through the cold start go first), or FILL_WAIT_MAX_S after it anyway.
FILL_DELAY_S = 0.5
FILL_WAIT_MAX_S = 60.0
# A worker asked to stop (SIGTERM: scaled down) before its fill finished completes it after it
# reports `stopped` (nobody is billed for it), for at most this long; SIGINT (the platform
# shutting down) or a second signal cuts it short.
FILL_ON_EXIT_MAX_S = 120.0


class WorkerRuntime:
    """One worker process's life (boot, load, warm, serve, drain); its jobs are `self.jobs`."""

    def __init__(
        self,
        settings: WorkerSettings,
        worker_id: str,
        accelerator: str,
        assignment: Assignment | None = None,
        pool_engine: str = "builtin",
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id  # id given by the provider
        self.accelerator = accelerator  # cpu, h100, ...
        # what it serves; None while in the warm pool
        self.assignment = assignment
        # in the warm pool: the engine it prepares, and the only one it serves
        self.pool_engine = pool_engine
        self.control = ControlClient(
            settings.internal_url, settings.worker_token.get_secret_value(), worker_id
        )
        self.redis = redis_client(settings.redis_url)
        self.state = WorkerState.BOOTING
        self._stop = threading.Event()
        # set once the jobs in hand are done (a fill waiting for quiet may then run)
        self._drained = threading.Event()
        # set by a second stop signal or SIGINT: no cache-tier fill any more
        self._skip_fill = threading.Event()
        self._tier_fill: TierFill | None = None  # the load's, once loaded
        self.engine: ServingEngine | None = None
        self.loop: EngineLoop | None = None
        self.jobs = JobFlow(worker_id, self.control, self._on_busy)
        if assignment is not None:
            self.jobs.open(assignment)
        # weight bytes (done, total) while loading: sent with the heartbeat
        self._progress: tuple[int, int] | None = None
        self._progress_beat_at = 0.0
        # its own /metrics, served from `run` where the settings say; the heartbeat says where
        self.metrics = WorkerMetrics(process_started_at())
        self.metrics.combiners.update(claim=self.jobs.claims, report=self.jobs.reports)
        self.metrics_target: str | None = None

    # lifecycle ------------------------------------------------------------------------------

    def request_stop(self, signum: int | None = None, *_: Any) -> None:
        if signum == signal.SIGINT or self._stop.is_set():
            self._skip_fill.set()  # exit as soon as the jobs in hand are done
            if self._tier_fill is not None:
                self._tier_fill.cancel()
        self._stop.set()

    def _on_busy(self, busy: bool) -> None:
        """The first job taken, or the last one ended (called under the jobs' lock): BUSY and
        IDLE are only noted; the next periodic beat carries them (jobs.py says why)."""
        if busy and self.state is WorkerState.IDLE:
            self._note_state(WorkerState.BUSY)
        elif not busy and self.state is WorkerState.BUSY:
            self._note_state(WorkerState.IDLE)

    def _note_state(self, state: WorkerState) -> None:
        self.state = state

    def _set_state(
        self, state: WorkerState, reason: str | None = None, *, takes_handoffs: bool = False
    ) -> None:
        self.metrics.state_entered(state)  # a start-up phase's duration, when one ends
        self.state = state
        self.control.report_state(state.value, reason, takes_handoffs=takes_handoffs)
        self._beat()

    def _beat(self) -> None:
        a = self.assignment
        beat: dict[str, object] = {
            "worker_id": self.worker_id,
            "deployment_id": a.deployment_id if a else None,
            "state": self.state.value,
            "inflight": self.jobs.inflight,
            "at": time.time(),
        }
        if a is not None and self.loop is not None:  # serving: the jobs it holds (jobs.py)
            beat[HEARTBEAT_JOBS_FIELD] = self.jobs.held_jobs()
        progress = self._progress
        if progress is not None and self.state is WorkerState.LOADING:
            beat[HEARTBEAT_PROGRESS_FIELD] = {"bytes_done": progress[0], "bytes_total": progress[1]}
        if self.metrics_target is not None:
            beat[HEARTBEAT_METRICS_FIELD] = self.metrics_target
        if a is None:
            beat[HEARTBEAT_HOST_FIELD] = socket.gethostname()
            beat[HEARTBEAT_HOST_TIER_FIELD] = self._host_tier()
        try:
            self.redis.set(
                worker_heartbeat_key(self.worker_id), json.dumps(beat), ex=HEARTBEAT_TTL_S
            )
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)

    def _host_tier(self) -> list[str]:
        """The object URIs this host's memory tier holds (placement's locality signal)."""
        if not self.settings.loader_host_cache_bytes:
            return []
        try:
            from loader import cached_uris

            return sorted(cached_uris(self.settings.loader_host_cache_dir))
        except Exception as exc:  # a heartbeat never dies of its locality hint
            log.warning("host tier unreadable: %s", exc)
            return []

    def _on_load_progress(self, p: Progress) -> None:
        """Loader threads: note the bytes landed; beat early so a cold start's progress is
        fresh (at most every PROGRESS_BEAT_S, and always at the end)."""
        self._progress = (p.bytes_done, p.bytes_total)
        now = time.monotonic()
        if now - self._progress_beat_at >= PROGRESS_BEAT_S or p.bytes_done >= p.bytes_total:
            self._progress_beat_at = now
            self._beat()

    def _heartbeat_loop(self) -> None:
        while not self._done.wait(HEARTBEAT_INTERVAL_S):
            self._beat()

    def run(self) -> int:
        on_signals(self.request_stop)  # off the main thread: common/signals.py
        self._done = threading.Event()
        s = self.settings
        self.metrics_target = self.metrics.serve(s.worker_metrics_host, s.worker_metrics_port)
        # A sign of life before the boot's imports (torch's take seconds, many times that on a
        # host where several workers start at once): the control plane loses a worker that has
        # not beaten within its grace.
        self._beat()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        try:
            if self.assignment is None:
                self.assignment = self._wait_in_pool()
                if self.assignment is None:  # asked to stop while in the pool
                    self._set_state(WorkerState.STOPPED, reason="drained")
                    return 0
            else:
                # part of the boot: the load is urgent
                engine_setup.prepare_runtime(
                    self.accelerator,
                    collect=False,
                    engine=self.assignment.engine,
                    threads=s.worker_threads,
                )
            self._serve(self.assignment)
            return 0
        except Exception as exc:
            log.exception("worker failed")
            try:
                # The reason reaches users (the worker's `reason`, crash-loop errors): its type
                # and whole message, which names what failed (a URI, a tensor); bounded only.
                reason = bounded_reason(f"{type(exc).__name__}: {exc}")
                self._set_state(WorkerState.FAILED, reason=reason)
            except Exception:
                log.exception("could not report the failure")
            return 1
        finally:
            self._done.set()
            self.jobs.close()
            self.control.close()
            self.metrics.close()

    def _wait_in_pool(self) -> Assignment | None:
        """Warm-pool worker: get ready for any deployment on its engine, say so, then wait
        for one."""
        t0 = time.monotonic()
        engine_setup.prepare_runtime(
            self.accelerator,
            collect=True,
            engine=self.pool_engine,
            threads=self.settings.worker_threads,
        )
        ready_s = round(time.monotonic() - t0, 3)
        log.info(
            "in the warm pool, engine %s (runtime ready in %.2fs)",
            self.pool_engine,
            ready_s,
            extra={"duration_s": ready_s},
        )
        self._set_state(WorkerState.IDLE)
        # ValueError (another engine's assignment among them): fails the worker
        assignment = warm_pool.next_assignment(
            self.redis, self.worker_id, self.pool_engine, self._stop
        )
        if assignment is None:
            return None
        # its tenant's storage credentials, for the loader (boto3 and the S3 client)
        os.environ.update(assignment.storage_env)
        self.jobs.open(assignment)
        logs.set_process_fields(deployment_id=assignment.deployment_id)
        log.info(
            "assigned to deployment %s (version %d)",
            assignment.deployment_id,
            assignment.deployment_version,
        )
        return assignment

    def _serve(self, assignment: Assignment) -> None:
        """Load, warm up, serve until asked to stop, drain, finish the cache-tier fill."""
        self._set_state(WorkerState.LOADING)
        from worker.runtime.loading import fill_tiers

        served = engine_setup.load_engine(
            self.settings, assignment, self.accelerator, self._on_load_progress
        )
        if served.metrics is not None:
            self.metrics.model_loaded(served.metrics)
        self.engine = self.metrics.engine = served.engine
        self._tier_fill = served.tier_fill
        del served  # the engine holds the model; the fill needs only `tier_fill`
        self._warm_up_unless_jobs_wait(assignment.queue)
        from worker.runtime.engine_loop import EngineLoop

        self.loop = EngineLoop(
            self.engine,
            self.redis,
            self.settings.cancel_poll_s,
            self.jobs.on_finished,
            observer=self.metrics,
        )
        self.jobs.attach(self.engine, self.loop)
        self.loop.start()
        # from now on it pops the jobs handed to it at admission, with its queue's wake-ups
        self._set_state(WorkerState.IDLE, takes_handoffs=True)
        # The cache tiers the load missed fill afterwards, off the cold start's path (the next
        # worker of this model on this host reads them), once the jobs that waited for this
        # worker are served: the fill must not take their cores.
        filler = threading.Thread(
            target=self._fill_when_quiet,
            args=(functools.partial(fill_tiers, self._tier_fill),),
            name="fill-tiers",
            daemon=True,
        )
        filler.start()
        consume(
            self.settings.redis_url,
            assignment.queue,
            assignment.max_concurrency,
            self.jobs.handle,
            self._stop.is_set,
            handoffs=worker_handoffs_key(self.worker_id),
        )
        self._set_state(WorkerState.DRAINING)
        self.loop.stop(timeout_s=30)
        self._set_state(WorkerState.STOPPED, reason="drained")
        self._finish_fill(filler)

    def _fill_when_quiet(self, fill: Callable[[], None]) -> None:
        """Fill the tiers once no job is in flight (after FILL_DELAY_S, at most
        FILL_WAIT_MAX_S later); asked to stop first, once the drain is done."""
        deadline = time.monotonic() + FILL_WAIT_MAX_S
        if not self._stop.wait(FILL_DELAY_S):
            while self.jobs.inflight and time.monotonic() < deadline:
                if self._stop.wait(0.2):
                    break
        if self._stop.is_set():
            self._drained.wait()
        if not self._skip_fill.is_set():
            fill()

    def _finish_fill(self, filler: threading.Thread) -> None:
        """Stopped (the tenant's records have ended): let the fill finish, so a worker scaled
        down soon after its cold start still leaves its weights in the host tier for the next
        one, within FILL_ON_EXIT_MAX_S; the model is freed first."""
        self.engine = self.loop = self.metrics.engine = None
        self.jobs.detach()
        if self.accelerator != "cpu":
            import torch

            torch.cuda.empty_cache()
        self._drained.set()
        if not filler.is_alive():
            return
        log.info("finishing the cache-tier fill before exiting")
        filler.join(FILL_ON_EXIT_MAX_S)
        if filler.is_alive() and self._tier_fill is not None:
            log.warning("cache-tier fill cut off after %.0fs", FILL_ON_EXIT_MAX_S)
            self._tier_fill.cancel()
            filler.join(5)

    def _warm_up_unless_jobs_wait(self, queue: str) -> None:
        if jobs_waiting(self.settings.redis_url, queue):
            # A cold start: the jobs that woke this worker would wait through the warm-up
            # and then pay for the first pass anyway. The first of them warms the engine.
            log.info("no warm-up: jobs are waiting")
            return
        self._set_state(WorkerState.WARMING)
        assert self.engine is not None
        engine_setup.warm_up(self.engine)


def redis_client(url: str) -> redis.Redis:
    """The worker's Redis client: bounded waits on a dead path (REDIS_TIMEOUT_S)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1),
    )

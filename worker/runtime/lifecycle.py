"""Worker lifecycle: boot → load → warm → serve (idle ⇄ busy) → drain → stopped.

Each transition is reported to the control plane (it closes a billing segment); a heartbeat
in Redis tells the reconciler the worker is alive. SIGTERM means drain: stop taking work,
finish the jobs in hand, report, exit 0.

Serving holds up to ``max_concurrency`` jobs at once in one continuous-batching engine:

    consumer thread (kombu)    claim pool (HTTP)          engine thread
    ───────────────────────    ─────────────────          ─────────────
    delivery ──────────────▶  claim, parse, validate ──▶  engine.add_request, step,
                               (invalid: report failed)    XADD deltas, cancel/timeouts
    ack  ◀──── delivery.ack ◀─ complete (HTTP) ◀────────  finished job
    (on its own thread)

The worker is BUSY while it holds at least one claimed job, IDLE otherwise.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from worker.protocol import (
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_PROGRESS_FIELD,
    HEARTBEAT_TTL_S,
    PROGRESS_BEAT_S,
    WorkerState,
    worker_heartbeat_key,
)
from worker.runtime.consumer import Delivery, consume
from worker.runtime.control_client import ControlClient
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from loader import Progress
    from worker.engine.llm_engine import LLMEngine
    from worker.runtime.loading import LoadedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    worker_id: str  # id given by the provider
    deployment_id: str  # deployment served
    deployment_version: int  # spec version served
    model_uri: str  # where the weights are
    accelerator: str  # cpu, h100, ...
    queue: str  # broker queue consumed
    max_concurrency: int  # jobs held at once (requests batched by the engine)


class WorkerRuntime:
    def __init__(self, settings: WorkerSettings, identity: WorkerIdentity) -> None:
        self.settings = settings
        self.identity = identity
        self.control = ControlClient(
            settings.internal_url, settings.worker_token.get_secret_value(), identity.worker_id
        )
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.state = WorkerState.BOOTING
        self.inflight = 0
        self._stop = threading.Event()
        # serialises inflight changes with their BUSY / IDLE reports
        self._state_lock = threading.Lock()
        self.engine: Any = None
        # deliveries of the jobs in the engine (by id() of their Job), acked once stored
        self._acks: dict[int, Delivery] = {}
        self.loop: Any = None
        # claims and completion reports (HTTP with retries) run here, off the engine thread
        self._pool = ThreadPoolExecutor(
            max_workers=min(8, 2 + identity.max_concurrency), thread_name_prefix="jobs"
        )
        # weight bytes (done, total) while loading: sent with the heartbeat
        self._progress: tuple[int, int] | None = None
        self._progress_beat_at = 0.0

    # lifecycle ------------------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stop.set()

    def _set_state(self, state: WorkerState, reason: str | None = None) -> None:
        self.state = state
        self.control.report_state(state.value, reason)
        self._beat()

    def _beat(self) -> None:
        beat: dict[str, object] = {
            "worker_id": self.identity.worker_id,
            "deployment_id": self.identity.deployment_id,
            "state": self.state.value,
            "inflight": self.inflight,
            "at": time.time(),
        }
        progress = self._progress
        if progress is not None and self.state is WorkerState.LOADING:
            beat[HEARTBEAT_PROGRESS_FIELD] = {"bytes_done": progress[0], "bytes_total": progress[1]}
        try:
            self.redis.set(
                worker_heartbeat_key(self.identity.worker_id), json.dumps(beat), ex=HEARTBEAT_TTL_S
            )
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)

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
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self._done = threading.Event()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        try:
            self._set_state(WorkerState.LOADING)
            from worker.runtime.loading import load_model

            # a GPU worker loads straight into device memory; "cpu" workers stay on the host
            device = "cpu" if self.identity.accelerator == "cpu" else "cuda"
            loaded = load_model(
                self.identity.model_uri,
                device=device,
                options=self.settings.load_options(),
                on_progress=self._on_load_progress,
            )
            self.engine = self._build_engine(loaded)
            self._set_state(WorkerState.WARMING)
            self._warm_up()
            from worker.runtime.engine_loop import EngineLoop

            self.loop = EngineLoop(
                self.engine, self.redis, self.settings.cancel_poll_s, self._on_finished
            )
            self.loop.start()
            self._set_state(WorkerState.IDLE)
            consume(
                self.settings.redis_url,
                self.identity.queue,
                self.identity.max_concurrency,
                self._handle,
                self._stop.is_set,
            )
            self._set_state(WorkerState.DRAINING)
            self.loop.stop(timeout_s=30)
            self._set_state(WorkerState.STOPPED, reason="drained")
            return 0
        except Exception as exc:
            log.exception("worker failed")
            try:
                # The reason reaches users through crash-loop errors: type and message, short.
                self._set_state(WorkerState.FAILED, reason=f"{type(exc).__name__}: {exc}"[:100])
            except Exception:
                log.exception("could not report the failure")
            return 1
        finally:
            self._done.set()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.control.close()

    def _build_engine(self, loaded: LoadedModel) -> LLMEngine:
        """A continuous-batching engine over the loaded model, sized for max_concurrency."""
        from worker.engine.config import EngineConfig
        from worker.engine.llm_engine import LLMEngine

        # PLATFORM_ENGINE_* settings override the engine's defaults (ValueError if invalid).
        config = EngineConfig(
            max_num_seqs=self.identity.max_concurrency,
            max_model_len=loaded.max_context,
            **self.settings.engine_overrides(),  # type: ignore[arg-type]
        )
        engine = LLMEngine.from_model(loaded.model, loaded.tokenizer, loaded.eos_token_ids, config)
        log.info(
            "engine: %d KV blocks of %d tokens, max_model_len %d, max_num_seqs %d, "
            "token budget %d, prefix caching %s",
            engine.cache.num_blocks,
            engine.cache.block_size,
            engine.cache.max_model_len,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.enable_prefix_caching,
        )
        return engine

    def _warm_up(self) -> None:
        from worker.engine.params import SamplingParams

        # One short generation compiles kernels and touches every weight once.
        engine = self.engine
        engine.add_request("warm-up", engine.encode("warm up"), SamplingParams(max_tokens=2))
        while engine.has_unfinished_requests():
            engine.step()

    # jobs -----------------------------------------------------------------------------------

    def _handle(self, delivery: Delivery) -> None:
        """Consumer thread: start the job elsewhere (claiming is an HTTP call)."""
        self._pool.submit(self._start_job, delivery)

    def _job_started(self) -> None:
        with self._state_lock:
            self.inflight += 1
            if self.inflight == 1:
                self._set_state(WorkerState.BUSY)

    def _job_ended(self) -> None:
        with self._state_lock:
            self.inflight -= 1
            if self.inflight == 0 and self.state is WorkerState.BUSY:
                self._set_state(WorkerState.IDLE)

    def _start_job(self, delivery: Delivery) -> None:
        from worker.engine.params import SamplingParams
        from worker.runtime.engine_loop import Job

        job_id = delivery.job_id
        try:
            claim = self.control.claim(job_id)
        except Exception:
            log.exception("claim of job %s failed", job_id)
            delivery.ack()  # the reconciler re-dispatches it
            return
        if claim is None:
            log.info("job %s not claimable (done, canceled or taken); skipping", job_id)
            delivery.ack()
            return
        self._job_started()
        attempt = int(claim["attempt"])
        inp = claim["input"] or {}
        try:
            params = SamplingParams.from_input(inp)
            prompt = inp.get("prompt")
            if not isinstance(prompt, str):
                raise ValueError(f"prompt: must be a string, got {type(prompt).__name__}")
            prompt_ids = self.engine.encode(prompt)
            self.engine.validate(prompt_ids, params)
        except ValueError as exc:
            self._report(job_id, attempt, delivery, "failed", error=_invalid(exc))
            return
        except Exception as exc:  # never leave a claimed job without an outcome
            log.exception("could not start job %s", job_id)
            error = {"type": "model_error", "message": f"{type(exc).__name__}: {exc}"}
            self._report(job_id, attempt, delivery, "failed", error=error)
            return
        deadline = time.monotonic() + float(claim.get("execution_timeout_s") or 600)
        job = Job(job_id, attempt, prompt_ids, params, deadline, priority=delivery.priority)
        self._acks[id(job)] = delivery
        self.loop.submit(job)

    def _on_finished(self, job: Any, result: Any) -> None:
        """Engine thread: report on the pool, never block the engine."""
        delivery = self._acks.pop(id(job))
        self._pool.submit(
            self._report,
            job.job_id,
            job.attempt,
            delivery,
            result.status,
            output=result.output,
            error=result.error,
            prompt_tokens=result.prompt_tokens,
            generated_tokens=result.generated_tokens,
        )

    def _report(
        self, job_id: str, attempt: int, delivery: Delivery, status: str, **fields: Any
    ) -> None:
        """Store the outcome (retried for minutes), then IDLE if it was the last, then ack."""
        try:
            body = {k: v for k, v in fields.items() if v is not None}
            accepted = self.control.complete(job_id, attempt, status, **body)
            log.info(
                "job %s attempt %d %s: %s prompt tokens, %s generated%s",
                job_id,
                attempt,
                status,
                fields.get("prompt_tokens"),
                fields.get("generated_tokens"),
                "" if accepted else " (report fenced off)",
            )
        except Exception:
            log.exception("could not report job %s", job_id)
        finally:
            self._job_ended()
            delivery.ack()


def _invalid(exc: ValueError) -> dict[str, str]:
    return {"type": "invalid_input", "message": str(exc)}

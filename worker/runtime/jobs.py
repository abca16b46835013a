"""The worker's jobs: a delivery claimed, its input checked and handed to the engine; the
outcome reported, then the delivery acknowledged.

`JobFlow` is the job path; the `WorkerRuntime` (lifecycle.py) that owns one runs the process's
life (boot, load, serve, drain), hands it the engine once serving, and is told when the worker
turns busy or idle (its heartbeat carries the state).

    consumer thread        claim pool (HTTP, several claims per request: batching.py)
    handle ─────────────▶  _start_job: claim, parse, validate ──▶ engine loop (submit)
                                                                      │ finished
    delivery.ack ◀──────── _report: report (several per request) ◀── on_finished
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from common import logs, tracing
from common.job_input import MAX_CHOICES
from common.messages import Assignment, Claim
from common.protocol import MAX_JOBS_PER_REQUEST
from worker.runtime import job_trace
from worker.runtime.batching import Combiner
from worker.runtime.consumer import Delivery
from worker.runtime.control_client import ControlClient, Report

if TYPE_CHECKING:
    from worker.runtime.engine_loop import EngineLoop, Job, JobResult
    from worker.runtime.job_trace import JobTrace
    from worker.runtime.serving import ServingEngine

log = logging.getLogger(__name__)

# Claims (and, apart, reports) under way at once; the ones that wait meanwhile go together in
# the next request (batching.py). Two, not one: a request retried through a control plane's
# hiccup still leaves one for the rest.
REQUESTS_IN_FLIGHT = 2


class JobFlow:
    """The job path of a serving worker (`WorkerRuntime` owns one): deliveries claimed, started
    in the engine, reported and acknowledged; the jobs it holds, for the heartbeat."""

    def __init__(
        self, worker_id: str, control: ControlClient, on_busy: Callable[[bool], None]
    ) -> None:
        self.worker_id = worker_id
        # the control plane's /internal routes (claims, reports)
        self.control = control
        # told True when the first job is taken, False when the last one ends (under the lock)
        self._on_busy = on_busy
        self.deployment_id: str | None = None  # what it serves, once `open`
        # the engine and its loop, once serving (`attach`); None before and after
        self.engine: ServingEngine | None = None
        self.loop: EngineLoop | None = None
        # jobs claimed and not yet reported (the heartbeat and the tier fill read it)
        self.inflight = 0
        # serialises the counts below with the busy / idle they imply
        self._lock = threading.Lock()
        # deliveries of the jobs in the engine (by id() of their Job), acked once stored
        self._acks: dict[int, Delivery] = {}
        # job id -> attempt of the jobs claimed and not yet reported (under _lock)
        self._running: dict[str, int] = {}
        # deliveries handed to `_start_job` that it has not finished with (under _lock)
        self._starting = 0
        # ids of the jobs handed to it (claimed by the admission) not yet started here, under
        # _lock: held, for the heartbeat (`held_jobs`), from the moment they are popped
        self._handed: set[str] = set()
        # claims and completion reports (HTTP with retries) run here, off the engine thread;
        # sized by the assignment's concurrency
        self._pool: ThreadPoolExecutor | None = None
        # the pool's claims and reports, several in one request when they wait together
        # (through `self.control` at each call: tests replace it)
        self.claims: Combiner[str, dict[str, Any] | None] = Combiner(
            lambda job_ids: self.control.claims(job_ids),
            max_inflight=REQUESTS_IN_FLIGHT,
            max_items=MAX_JOBS_PER_REQUEST,
        )
        self.reports: Combiner[Report, bool] = Combiner(
            lambda reports: self.control.reports(reports),
            max_inflight=REQUESTS_IN_FLIGHT,
            max_items=MAX_JOBS_PER_REQUEST,
        )

    def open(self, assignment: Assignment) -> None:
        """Ready for the jobs of `assignment` (its concurrency sizes the pool)."""
        self.deployment_id = assignment.deployment_id
        self._pool = ThreadPoolExecutor(
            max_workers=min(8, 2 + assignment.max_concurrency), thread_name_prefix="jobs"
        )

    def attach(self, engine: ServingEngine, loop: EngineLoop) -> None:
        """Serve with `engine`, through `loop` (whose `on_finished` is `self.on_finished`)."""
        self.engine, self.loop = engine, loop

    def detach(self) -> None:
        """Drained: the engine and its model are freed."""
        self.engine = self.loop = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def jobs_pool(self) -> ThreadPoolExecutor:
        assert self._pool is not None, "no assignment yet"
        return self._pool

    def handle(self, delivery: Delivery) -> None:
        """Consumer thread: start the job. On a worker with no other job to start or run, here
        (the claim is an HTTP call, which nothing else is waiting to overlap with): handed to
        the pool, it cost a thread's wake-up on every call of an idle deployment, the warm
        path's (~0.2 ms). Else on the pool, so that claims go out together while this thread
        takes the next wake-up."""
        start = logs.bound(self._start_job, job_id=delivery.job_id)
        with self._lock:
            alone = self.inflight == 0 and self._starting == 0
            self._starting += 1
            if delivery.claim is not None:
                self._handed.add(delivery.job_id)
        if alone:
            start(delivery)
        else:
            self.jobs_pool.submit(start, delivery)

    # BUSY and IDLE follow the jobs: the control plane derives them from claims and job ends
    # (`services/workers/worker_records.follow_jobs`), so they are only noted here; the next
    # periodic beat carries them (nothing reads a beat's state to decide). A beat of its own at each
    # flip was a Redis round trip between the claim and the engine, and another at each job's end.

    def _job_started(self) -> None:
        with self._lock:
            self.inflight += 1
            if self.inflight == 1:
                self._on_busy(True)

    def _job_ended(self) -> None:
        with self._lock:
            self.inflight -= 1
            if self.inflight == 0:
                self._on_busy(False)

    def held_jobs(self) -> list[str]:
        """The ids of the jobs this worker holds: handed to it or claimed, not yet reported
        (its heartbeat lists them: a job it was given and does not hold was never received)."""
        with self._lock:
            return sorted(self._running.keys() | self._handed)

    def _start_job(self, delivery: Delivery) -> None:
        try:
            self._claim_and_submit(delivery)
        finally:
            with self._lock:
                self._starting -= 1
                if delivery.claim is not None:
                    self._handed.discard(delivery.job_id)

    def _claim_and_submit(self, delivery: Delivery) -> None:
        from worker.engine.params import SamplingParams
        from worker.runtime.engine_loop import Job

        engine, loop = self.engine, self.loop
        assert engine is not None and loop is not None, "no engine attached"
        job_id = delivery.job_id
        claim_started_ns = time.time_ns()
        # a job handed to it at admission comes claimed already (control_plane/.../handoff.py)
        claim = delivery.claim
        try:
            if claim is None:
                answer = self.claims.call(job_id)
                if answer is None:
                    log.info("job %s not claimable (done, canceled or taken); skipping", job_id)
                    delivery.ack()
                    return
                claim = self._read_claim(answer, delivery)
                if claim is None:
                    return
        except Exception:
            log.exception("claim of job %s failed", job_id)
            delivery.ack()  # the reconciler re-dispatches it
            return
        attempt = claim.attempt
        # A claim hands a worker the attempt it already holds (so that a claim retried after
        # a lost answer gets its job): a second delivery of that job must not run it twice.
        with self._lock:
            duplicate = self._running.get(job_id) == attempt
            if not duplicate:
                self._running[job_id] = attempt
        if duplicate:
            log.info("job %s attempt %d already runs here; skipping", job_id, attempt)
            delivery.ack()
            return
        self._job_started()
        # None when tracing is off
        trace = job_trace.start(claim, self.worker_id, self.deployment_id, claim_started_ns)
        if trace is not None:
            logs.bind(**trace.log_ids())  # this job's lines name its trace
        try:
            params = SamplingParams.from_job_input(claim.input)
            if isinstance(claim.input.n, bool) or not 1 <= claim.input.n <= MAX_CHOICES:
                raise ValueError(f"n: must be in [1, {MAX_CHOICES}], got {claim.input.n!r}")
            prompt_ids = engine.encode(claim.input.prompt, claim.input.add_special_tokens)
            engine.validate(prompt_ids, params)
        except ValueError as exc:
            self._report(job_id, attempt, delivery, "failed", trace=trace, error=_invalid(exc))
            return
        except Exception as exc:  # never leave a claimed job without an outcome
            log.exception("could not start job %s", job_id)
            error = {"type": "model_error", "message": f"{type(exc).__name__}: {exc}"}
            self._report(job_id, attempt, delivery, "failed", trace=trace, error=error)
            return
        deadline = time.monotonic() + claim.execution_timeout_s
        job = Job(
            job_id,
            attempt,
            prompt_ids,
            params,
            deadline,
            priority=delivery.priority,
            n=claim.input.n,
            trace=trace,
        )
        self._acks[id(job)] = delivery
        loop.submit(job)

    def _read_claim(self, answer: dict[str, Any], delivery: Delivery) -> Claim | None:
        """The claim route's answer, typed; None (reported failed, or dropped) when it cannot
        be read. The control plane stores only inputs it validated, so this is a row the
        worker cannot run: its attempt is ended, not left running."""
        try:
            return Claim.from_dict(answer)
        except ValueError as exc:
            attempt = answer.get("attempt")
            if isinstance(attempt, int) and not isinstance(attempt, bool):
                with self._lock:
                    self._running[delivery.job_id] = attempt
                self._job_started()
                self._report(delivery.job_id, attempt, delivery, "failed", error=_invalid(exc))
            else:
                log.warning("job %s: unreadable claim answer dropped", delivery.job_id)
                delivery.ack()
            return None

    def on_finished(self, job: Job, result: JobResult) -> None:
        """Engine thread: report on the pool, never block the engine."""
        delivery = self._acks.pop(id(job))
        if job.trace is not None:
            job.trace.engine(job, result)
        self.jobs_pool.submit(
            logs.bound(
                self._report,
                job_id=job.job_id,
                **(job.trace.log_ids() if job.trace is not None else {}),
            ),
            job.job_id,
            job.attempt,
            delivery,
            result.status,
            trace=job.trace,
            output=result.output,
            error=result.error,
            prompt_tokens=result.prompt_tokens,
            generated_tokens=result.generated_tokens,
        )

    def _report(
        self,
        job_id: str,
        attempt: int,
        delivery: Delivery,
        status: str,
        *,
        trace: JobTrace | None = None,
        **fields: Any,
    ) -> None:
        """Store the outcome (retried for minutes), then IDLE if it was the last, then ack."""
        try:
            body = {k: v for k, v in fields.items() if v is not None}
            with trace.reporting() if trace is not None else contextlib.nullcontext() as headers:
                tp = (headers or {}).get(tracing.TRACEPARENT)
                accepted = self.reports.call(Report(job_id, attempt, status, body, tp))
            log.info(
                "job %s attempt %d %s: %s prompt tokens, %s generated%s",
                job_id,
                attempt,
                status,
                fields.get("prompt_tokens"),
                fields.get("generated_tokens"),
                "" if accepted else " (report fenced off)",
                extra={"attempt": attempt, "status": status},
            )
        except Exception:
            log.exception("could not report job %s", job_id)
        finally:
            if trace is not None:
                trace.end(status, fields.get("error"))
            with self._lock:
                if self._running.get(job_id) == attempt:
                    del self._running[job_id]
            self._job_ended()
            delivery.ack()


def _invalid(exc: ValueError) -> dict[str, str]:
    return {"type": "invalid_input", "message": str(exc)}

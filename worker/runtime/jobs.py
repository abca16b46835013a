"""The worker's jobs: a delivery claimed, its input checked and handed to the engine; the
outcome reported, then the delivery acknowledged.

A part of `WorkerRuntime` (lifecycle.py), kept in a module of its own: `JobFlow` holds the job
state (`_init_jobs`) and the job path; the runtime around it owns the process's life (boot,
load, serve, drain) and the state that `_note_state` updates (its heartbeat carries it).

    consumer thread        claim pool (HTTP, several claims per request: batching.py)
    _handle ────────────▶  _start_job: claim, parse, validate ──▶ engine loop (submit)
                                                                      │ finished
    delivery.ack ◀──────── _report: report (several per request) ◀── _on_finished
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from common import logs, tracing
from common.protocol import MAX_JOBS_PER_REQUEST, Assignment, WorkerState
from worker.runtime import job_trace
from worker.runtime.batching import Combiner
from worker.runtime.consumer import Delivery
from worker.runtime.control_client import ControlClient, Report

if TYPE_CHECKING:
    from worker.runtime.job_trace import JobTrace

log = logging.getLogger(__name__)

# Claims (and, apart, reports) under way at once; the ones that wait meanwhile go together in
# the next request (batching.py). Two, not one: a request retried through a control plane's
# hiccup still leaves one for the rest.
REQUESTS_IN_FLIGHT = 2


class JobFlow:
    """The job path of `WorkerRuntime`, which sets the attributes declared here."""

    worker_id: str
    assignment: Assignment | None  # what it serves; None while in the warm pool
    control: ControlClient
    engine: Any
    loop: Any  # the engine loop (engine_loop.EngineLoop), once serving
    state: WorkerState
    inflight: int  # jobs claimed and not yet reported
    # serialises inflight changes with the BUSY / IDLE they imply
    _state_lock: threading.Lock

    def _init_jobs(self, assignment: Assignment | None) -> None:
        # deliveries of the jobs in the engine (by id() of their Job), acked once stored
        self._acks: dict[int, Delivery] = {}
        # job id -> attempt of the jobs claimed and not yet reported (under _state_lock)
        self._running: dict[str, int] = {}
        # deliveries handed to `_start_job` that it has not finished with (under _state_lock)
        self._starting = 0
        # ids of the jobs handed to it (claimed by the admission) not yet started here, under
        # _state_lock: held, for the heartbeat (`_held_jobs`), from the moment they are popped
        self._handed: set[str] = set()
        # claims and completion reports (HTTP with retries) run here, off the engine thread;
        # sized by the assignment's concurrency
        self._pool: ThreadPoolExecutor | None = None
        # the pool's claims and reports, several in one request when they wait together
        # (through `self.control` at each call: tests replace it)
        self._claims: Combiner[str, dict[str, Any] | None] = Combiner(
            lambda job_ids: self.control.claims(job_ids),
            max_inflight=REQUESTS_IN_FLIGHT,
            max_items=MAX_JOBS_PER_REQUEST,
        )
        self._reports: Combiner[Report, bool] = Combiner(
            lambda reports: self.control.reports(reports),
            max_inflight=REQUESTS_IN_FLIGHT,
            max_items=MAX_JOBS_PER_REQUEST,
        )
        if assignment is not None:
            self._open_job_pool(assignment)

    def _open_job_pool(self, assignment: Assignment) -> None:
        self._pool = ThreadPoolExecutor(
            max_workers=min(8, 2 + assignment.max_concurrency), thread_name_prefix="jobs"
        )

    @property
    def jobs_pool(self) -> ThreadPoolExecutor:
        assert self._pool is not None, "no assignment yet"
        return self._pool

    def _handle(self, delivery: Delivery) -> None:
        """Consumer thread: start the job. On a worker with no other job to start or run, here
        (the claim is an HTTP call, which nothing else is waiting to overlap with): handed to
        the pool, it cost a thread's wake-up on every call of an idle deployment, the warm
        path's (~0.2 ms). Else on the pool, so that claims go out together while this thread
        takes the next wake-up."""
        start = logs.bound(self._start_job, job_id=delivery.job_id)
        with self._state_lock:
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
        with self._state_lock:
            self.inflight += 1
            if self.inflight == 1 and self.state is WorkerState.IDLE:
                self._note_state(WorkerState.BUSY)

    def _job_ended(self) -> None:
        with self._state_lock:
            self.inflight -= 1
            if self.inflight == 0 and self.state is WorkerState.BUSY:
                self._note_state(WorkerState.IDLE)

    def _note_state(self, state: WorkerState) -> None:
        self.state = state

    def _held_jobs(self) -> list[str]:
        """The ids of the jobs this worker holds: handed to it or claimed, not yet reported
        (its heartbeat lists them: a job it was given and does not hold was never received)."""
        with self._state_lock:
            return sorted(self._running.keys() | self._handed)

    def _start_job(self, delivery: Delivery) -> None:
        try:
            self._claim_and_submit(delivery)
        finally:
            with self._state_lock:
                self._starting -= 1
                if delivery.claim is not None:
                    self._handed.discard(delivery.job_id)

    def _claim_and_submit(self, delivery: Delivery) -> None:
        from worker.engine.params import SamplingParams
        from worker.runtime.engine_loop import Job

        job_id = delivery.job_id
        claim_started_ns = time.time_ns()
        # a job handed to it at admission comes claimed already (control_plane/.../handoff.py)
        claim = delivery.claim
        try:
            if claim is None:
                claim = self._claims.call(job_id)
        except Exception:
            log.exception("claim of job %s failed", job_id)
            delivery.ack()  # the reconciler re-dispatches it
            return
        if claim is None:
            log.info("job %s not claimable (done, canceled or taken); skipping", job_id)
            delivery.ack()
            return
        attempt = int(claim["attempt"])
        # A claim hands a worker the attempt it already holds (so that a claim retried after
        # a lost answer gets its job): a second delivery of that job must not run it twice.
        with self._state_lock:
            duplicate = self._running.get(job_id) == attempt
            if not duplicate:
                self._running[job_id] = attempt
        if duplicate:
            log.info("job %s attempt %d already runs here; skipping", job_id, attempt)
            delivery.ack()
            return
        self._job_started()
        dep_id = self.assignment.deployment_id if self.assignment else None
        trace = job_trace.start(claim, self.worker_id, dep_id, claim_started_ns)  # None: off
        if trace is not None:
            logs.bind(**trace.log_ids())  # this job's lines name its trace
        inp = claim["input"] or {}
        try:
            params = SamplingParams.from_input(inp)
            prompt = inp.get("prompt")
            if not isinstance(prompt, str):
                raise ValueError(f"prompt: must be a string, got {type(prompt).__name__}")
            prompt_ids = self.engine.encode(prompt)
            self.engine.validate(prompt_ids, params)
        except ValueError as exc:
            self._report(job_id, attempt, delivery, "failed", trace=trace, error=_invalid(exc))
            return
        except Exception as exc:  # never leave a claimed job without an outcome
            log.exception("could not start job %s", job_id)
            error = {"type": "model_error", "message": f"{type(exc).__name__}: {exc}"}
            self._report(job_id, attempt, delivery, "failed", trace=trace, error=error)
            return
        deadline = time.monotonic() + float(claim.get("execution_timeout_s") or 600)
        job = Job(
            job_id, attempt, prompt_ids, params, deadline, priority=delivery.priority, trace=trace
        )
        self._acks[id(job)] = delivery
        self.loop.submit(job)

    def _on_finished(self, job: Any, result: Any) -> None:
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
                accepted = self._reports.call(Report(job_id, attempt, status, body, tp))
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
            with self._state_lock:
                if self._running.get(job_id) == attempt:
                    del self._running[job_id]
            self._job_ended()
            delivery.ack()


def _invalid(exc: ValueError) -> dict[str, str]:
    return {"type": "invalid_input", "message": str(exc)}

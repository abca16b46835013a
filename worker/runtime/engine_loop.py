"""The engine thread: feeds claimed jobs to the engine, steps it, streams outputs to Redis.

One thread owns the engine (built-in or vLLM, `worker/runtime/serving.py`; not thread-safe).
Other threads hand it jobs with ``submit``; each engine step's text deltas go out in one Redis
pipeline (XADD to each job's event stream); cancel flags and execution deadlines are checked
every ``cancel_poll_s``; a finished job is handed to ``on_finished`` (which must not block: the
runtime reports it to the control plane on another thread).

Example:

    >>> loop = EngineLoop(engine, redis_client, cancel_poll_s=0.2, on_finished=report)
    >>> loop.start()
    >>> loop.submit(Job("job_1", attempt=1, prompt_ids=ids, params=params, deadline=t + 600))
    >>> loop.stop()  # after the last job finished
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import redis

from common.protocol import JOB_EVENTS_MAXLEN, EventType, job_cancel_key, job_events_key
from worker.engine.outputs import RequestMetrics, RequestOutput, TokenLogprobs
from worker.engine.params import SamplingParams
from worker.engine.token_bytes import TokenBytes
from worker.runtime.serving import ServingEngine

log = logging.getLogger(__name__)

JobStatus = Literal["succeeded", "failed", "canceled", "timed_out"]


@dataclass(slots=True)
class Choice:
    """One of a job's `n` sequences (an engine request) and what it generated so far."""

    # its place among the job's choices; choice 0's engine request id is the job id
    index: int
    request_id: str
    # the generated text so far, and its length in characters
    text_parts: list[str] = field(default_factory=list)
    text_chars: int = 0
    # log-probabilities per generated token, when asked for (OpenAI's chat shape: token,
    # bytes, logprob, top_logprobs), and those not yet sent with a delta
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    unsent_logprobs: list[dict[str, Any]] = field(default_factory=list)
    # its last output, once finished
    final: RequestOutput | None = None


@dataclass(slots=True)
class Job:
    """A claimed job on its way through the engine."""

    # control-plane job id (also the engine's request id of its first choice)
    job_id: str
    # attempt number from the claim (fences the completion report)
    attempt: int
    # tokenized prompt (validated by the engine)
    prompt_ids: list[int]
    # how it generates
    params: SamplingParams
    # time.monotonic() after which the job is stopped as timed_out
    deadline: float
    # scheduling class (broker priority: lower first)
    priority: int = 0
    # sequences generated from the prompt: the first is prefilled alone, the others join
    # once its prompt blocks are cached, and share them (worker.engine.block_manager)
    n: int = 1
    # its sequences (built by the engine loop)
    choices: list[Choice] = field(default_factory=list)
    # "canceled" or "timed_out" once an abort was requested
    abort_reason: str | None = None
    # its spans on this worker (runtime/job_trace.py); None when tracing is off. Opaque here.
    trace: Any = None
    # time.monotonic() before which its cancel flag is not polled: its claim, just before it
    # came in, found it not canceled (set when the engine takes it)
    poll_after: float = 0.0


@dataclass(frozen=True, slots=True)
class JobResult:
    """What to report to the control plane for a finished job."""

    status: JobStatus
    # {"text", "finish_reason", "cached_tokens", "timings", ["logprobs"], ["choices"]} unless
    # failed (text, finish_reason and logprobs: the first choice's; "choices": all, when n > 1)
    output: dict[str, Any] | None
    # {"type", "message"} when failed
    error: dict[str, str] | None
    # token counts (None when failed)
    prompt_tokens: int | None
    generated_tokens: int | None
    # the engine's timings of the request (its trace spans); None when it never ran
    metrics: RequestMetrics | None = None


class Observer(Protocol):
    """Sees what goes through the engine (counts and times only: never text)."""

    def request_admitted(self, num_prompt_tokens: int) -> None: ...

    def step_outputs(self, outputs: Sequence[RequestOutput]) -> None: ...


class EngineLoop:
    """Owns the engine on its own thread (see the module doc)."""

    def __init__(
        self,
        engine: ServingEngine,
        redis_client: redis.Redis,
        cancel_poll_s: float,
        on_finished: Callable[[Job, JobResult], None],
        *,
        observer: Observer | None = None,
    ) -> None:
        self.engine = engine
        self.redis = redis_client
        self.cancel_poll_s = cancel_poll_s
        self.on_finished = on_finished
        self.observer = observer  # the worker's metrics (worker/runtime/metrics.py)
        self._inbox: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._jobs: dict[str, Job] = {}
        # engine request id -> its job and choice
        self._choices: dict[str, tuple[Job, Choice]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._next_poll = 0.0
        self._token_bytes = TokenBytes(engine.tokenizer)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Thread-safe: queue a job for the engine."""
        self._inbox.put(job)

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop once idle (jobs in flight are finished first) and wait for the thread."""
        self._stop.set()
        self._inbox.put(_WAKE)
        self._thread.join(timeout_s)

    # the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._take_new_jobs(block=not self.engine.has_unfinished_requests())
            if self._stop.is_set() and not self._jobs and self._inbox.empty():
                return
            if not self._jobs:
                continue
            self._check_aborts()
            try:
                outputs = self.engine.step()
            except Exception as exc:
                log.exception("engine step failed; failing %d jobs", len(self._jobs))
                self._fail_all(f"{type(exc).__name__}: {exc}")
                continue
            self._publish(outputs)

    def _take_new_jobs(self, block: bool) -> None:
        try:
            job = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if job is not _WAKE:
                self._add(job)
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, job: Job) -> None:
        first = Choice(0, job.job_id)
        try:
            self.engine.add_request(job.job_id, job.prompt_ids, job.params, job.priority)
        except ValueError as exc:  # validated before submit; a duplicate delivery lands here
            self._report(job, _failed("invalid_input", str(exc), job))
            return
        job.choices = [first]
        job.poll_after = time.monotonic() + self.cancel_poll_s
        self._jobs[job.job_id] = job
        self._choices[first.request_id] = (job, first)
        if self.observer is not None:
            self.observer.request_admitted(len(job.prompt_ids))

    def _add_siblings(self, job: Job) -> None:
        """The job's other choices, once its first has been prefilled: their prompts then find
        its full blocks in the prefix cache (only the last, partial block is computed again)."""
        for index in range(1, job.n):
            choice = Choice(index, f"{job.job_id}#{index}")
            params = job.params
            if params.seed is not None:  # seeded choices differ from each other, reproducibly
                params = dataclasses.replace(params, seed=params.seed + index)
            self.engine.add_request(choice.request_id, job.prompt_ids, params, job.priority)
            job.choices.append(choice)
            self._choices[choice.request_id] = (job, choice)

    def _check_aborts(self) -> None:
        """Every `cancel_poll_s`: the cancel flags of the jobs in flight (one round trip) and
        their deadlines. A job taken less than a poll ago is left out of the round trip (its
        claim found it not canceled), so a job arriving at an idle engine starts at once; when
        only such jobs are in flight, the poll waits for the first of them to be due."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        jobs = list(self._jobs.values())
        asked = [job for job in jobs if job.poll_after <= now]
        if not asked:
            self._next_poll = min(job.poll_after for job in jobs)
            return
        self._next_poll = now + self.cancel_poll_s
        try:
            pipe = self.redis.pipeline(transaction=False)
            for job in asked:
                pipe.exists(job_cancel_key(job.job_id))
            flags = pipe.execute()
        except redis.RedisError as exc:
            log.warning("cancel poll failed: %s", exc)
            flags = [0] * len(asked)
        canceled = {job.job_id for job, flag in zip(asked, flags, strict=True) if flag}
        for job in jobs:
            if job.job_id in canceled:
                job.abort_reason = "canceled"
            elif now > job.deadline:
                job.abort_reason = "timed_out"
            else:
                continue
            finals = [self.engine.abort_request(c.request_id) for c in job.choices]
            self._publish([f for f in finals if f is not None])

    def _publish(self, outputs: list[RequestOutput]) -> None:
        if self.observer is not None:
            self.observer.step_outputs(outputs)
        events: list[tuple[str, str]] = []
        for out in outputs:
            found = self._choices.get(out.request_id)
            if found is None:
                continue
            job, choice = found
            if out.logprobs:
                entries = [self._logprob_entry(lp) for lp in out.logprobs]
                choice.logprobs.extend(entries)
                choice.unsent_logprobs.extend(entries)
            if choice.index == 0 and len(job.choices) < job.n and job.abort_reason is None:
                self._add_siblings(job)  # the first choice's prompt is computed
            if out.text_delta:
                # The attempt and where in its text the delta starts let a stream's reader
                # drop a lost attempt's deltas and see that some were lost
                # (control_plane/domain/stream_text.py).
                delta: dict[str, Any] = {
                    "delta": out.text_delta,
                    "generated_tokens": out.num_generated_tokens,
                    "attempt": job.attempt,
                    "offset": choice.text_chars,
                }
                if choice.index:
                    delta["index"] = choice.index
                if choice.unsent_logprobs:
                    # the tokens up to this delta (a token held back by a stop string goes
                    # out with the text that follows it, or only in the final output)
                    delta["logprobs"] = choice.unsent_logprobs
                    choice.unsent_logprobs = []
                choice.text_parts.append(out.text_delta)
                choice.text_chars += len(out.text_delta)
                events.append((job_events_key(job.job_id), json.dumps(delta)))
        if events:
            try:
                pipe = self.redis.pipeline(transaction=False)
                for key, data in events:
                    entry: dict[str | bytes, str | bytes] = {
                        "type": EventType.OUTPUT.value,
                        "data": data,
                    }
                    pipe.xadd(key, entry, maxlen=JOB_EVENTS_MAXLEN, approximate=True)  # type: ignore[arg-type]
                pipe.execute()
            except redis.RedisError as exc:
                # deltas are a convenience: the whole text goes with the completion report
                log.warning("could not stream %d deltas: %s", len(events), exc)
        for out in outputs:
            found = self._choices.get(out.request_id)
            if found is None or not out.finished:
                continue
            job, choice = found
            choice.final = out
            del self._choices[out.request_id]
            if len(job.choices) == job.n and all(c.final is not None for c in job.choices):
                self._finish(job, _result(job))
            elif job.abort_reason is not None and all(c.final for c in job.choices):
                self._finish(job, _result(job))  # aborted before its other choices joined

    def _logprob_entry(self, lp: TokenLogprobs) -> dict[str, Any]:
        """One token's log-probabilities in OpenAI's chat shape (`bytes` exact, see
        `worker.engine.token_bytes`)."""
        text, raw = self._token_bytes.text_and_bytes(lp.token_id)
        top = []
        for token_id, logprob in lp.top:
            alt_text, alt_raw = self._token_bytes.text_and_bytes(token_id)
            top.append({"token": alt_text, "bytes": alt_raw, "logprob": _finite(logprob)})
        return {"token": text, "bytes": raw, "logprob": _finite(lp.logprob), "top_logprobs": top}

    def _fail_all(self, message: str) -> None:
        for job in list(self._jobs.values()):
            for choice in job.choices:
                self.engine.abort_request(choice.request_id)
                self._choices.pop(choice.request_id, None)
            self._finish(job, _failed("model_error", message, job))

    def _finish(self, job: Job, result: JobResult) -> None:
        del self._jobs[job.job_id]
        self._report(job, result)

    def _report(self, job: Job, result: JobResult) -> None:
        try:
            self.on_finished(job, result)
        except Exception:
            log.exception("reporting job %s failed", job.job_id)


_WAKE = Job("", 0, [], SamplingParams(), 0.0)


# OpenAI's log-probability of a token that cannot be sampled (JSON has no -Infinity): e.g.
# the alternatives a structured output's grammar masks out
MIN_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return logprob if logprob > MIN_LOGPROB else MIN_LOGPROB


def _result(job: Job) -> JobResult:
    finals = [c.final for c in job.choices if c.final is not None]
    first = finals[0]
    status: JobStatus = "succeeded"
    if any(f.finish_reason == "abort" for f in finals):
        status = "timed_out" if job.abort_reason == "timed_out" else "canceled"
    output = _choice_output(job.choices[0], first, job.params.logprobs is not None)
    output["cached_tokens"] = first.num_cached_tokens
    if first.metrics is not None:
        output["timings"] = first.metrics.to_dict()
    if job.n > 1:
        # each with the prompt tokens it found cached (the first choice's blocks)
        output["choices"] = [
            {
                "index": c.index,
                **_choice_output(c, c.final, job.params.logprobs is not None),
                "cached_tokens": c.final.num_cached_tokens,
            }
            for c in job.choices
            if c.final is not None
        ]
    # the prompt counts once; every choice's tokens count
    generated = sum(f.num_generated_tokens for f in finals)
    return JobResult(status, output, None, first.num_prompt_tokens, generated, first.metrics)


def _choice_output(choice: Choice, final: RequestOutput, logprobs: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"text": "".join(choice.text_parts), "finish_reason": final.finish_reason}
    if logprobs:
        out["logprobs"] = choice.logprobs
    return out


def _failed(kind: str, message: str, job: Job) -> JobResult:
    return JobResult("failed", None, {"type": kind, "message": message}, None, None)

"""One job's spans on the worker, under the trace its claim names (docs/observability.md "Traces"):

    job.run                        [consumer]  claim → report accepted
    ├── job.claim                  [client]    POST /internal/jobs/<id>/claim
    ├── text_completion <model>    [internal]  in the engine: arrival → finished
    │   │                                      (event `first_token`)
    │   ├── prefill                            first scheduled → first token
    │   └── decode                             first token → finished
    └── job.complete               [client]    POST …/complete (its `traceparent` header
                                               makes the API's server span a child)

The engine spans are drawn after the fact from the engine's own timings (`RequestMetrics`), so
the engine thread does nothing per step for them. Counts, times and reasons only, never text.
`start` returns None when tracing is off; the runtime then skips every call here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from common import tracing
from common.messages import Claim

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from worker.runtime.engine_loop import Job, JobResult

log = logging.getLogger(__name__)


class JobTrace:
    """The open `job.run` span of one claimed job and what its children need."""

    def __init__(self, run: Span, model: str | None, job_id: str) -> None:
        self.run = run  # job.run: ended by `end`
        self.model = model  # the deployment's name (gen_ai.request.model)
        self.job_id = job_id

    def log_ids(self) -> dict[str, str]:
        """The trace and the `job.run` span, for the job's log lines on this worker."""
        return tracing.ids_of(self.run)

    def engine(self, job: Job, result: JobResult) -> None:
        """The engine's run of the job, from its timings (none if it never ran)."""
        with _never_raises(self.job_id):
            self._engine(job, result)

    def _engine(self, job: Job, result: JobResult) -> None:
        m = result.metrics
        if m is None:
            return
        ns = tracing.epoch_ns_of_monotonic
        output = result.output or {}
        reason = output.get("finish_reason")
        attributes = {
            tracing.GEN_AI_OPERATION: tracing.OPERATION,
            tracing.GEN_AI_MODEL: self.model,
            tracing.GEN_AI_MAX_TOKENS: job.params.max_tokens,
            tracing.GEN_AI_INPUT_TOKENS: result.prompt_tokens,
            tracing.GEN_AI_OUTPUT_TOKENS: result.generated_tokens,
            tracing.GEN_AI_FINISH_REASONS: [reason] if reason else None,
            tracing.JOB_ID: self.job_id,
            "platform.engine.cached_tokens": output.get("cached_tokens"),
            "platform.engine.preemptions": m.num_preemptions,
        }
        name = f"{tracing.OPERATION} {self.model}" if self.model else tracing.OPERATION
        span = tracing.start_span(
            name,
            parent=tracing.parent_of(self.run),
            attributes=attributes,
            start_ns=ns(m.arrival_time),
        )
        if span is None:
            return
        end_ns = ns(m.finished_time)
        under = tracing.parent_of(span)
        if m.first_scheduled_time is not None:
            prefill_end = m.first_token_time if m.first_token_time is not None else m.finished_time
            prefill = tracing.start_span(
                "prefill",
                parent=under,
                attributes={
                    "platform.engine.prompt_tokens": result.prompt_tokens,
                    "platform.engine.cached_tokens": output.get("cached_tokens"),
                },
                start_ns=ns(m.first_scheduled_time),
            )
            if prefill is not None:
                prefill.end(end_time=ns(prefill_end))
        if m.first_token_time is not None:
            span.add_event("first_token", timestamp=ns(m.first_token_time))
            decode = tracing.start_span(
                "decode",
                parent=under,
                attributes={"platform.engine.generated_tokens": result.generated_tokens},
                start_ns=ns(m.first_token_time),
            )
            if decode is not None:
                decode.end(end_time=end_ns)
        span.end(end_time=end_ns)

    @contextlib.contextmanager
    def reporting(self) -> Iterator[dict[str, str] | None]:
        """The completion report's span; yields the headers that carry it to the API."""
        span = tp = None
        with _never_raises(self.job_id):
            span = tracing.start_span(
                "job.complete", parent=tracing.parent_of(self.run), kind="client"
            )
            tp = tracing.traceparent_of(span)
        try:
            yield {tracing.TRACEPARENT: tp} if tp else None
        except BaseException as exc:
            if span is not None:
                tracing.failed(span, type(exc).__name__)
            raise
        finally:
            if span is not None:
                span.end()

    def end(self, status: str, error: Mapping[str, Any] | None = None) -> None:
        with _never_raises(self.job_id):
            self.run.set_attribute(tracing.JOB_STATUS, status)
            if error is not None:
                tracing.failed(self.run, str(error.get("type", "error")))
            self.run.end()


@contextlib.contextmanager
def _never_raises(job_id: str) -> Iterator[None]:
    """A job is never lost to its trace: a failure here is logged and the job goes on."""
    try:
        yield
    except Exception:
        log.warning("tracing job %s failed", job_id, exc_info=True)


def start(
    claim: Claim, worker_id: str, deployment_id: str | None, claim_started_ns: int
) -> JobTrace | None:
    """`job.run` and `job.claim` (from `claim_started_ns` to now) under the claim's trace, or a
    new trace when it names none; None when tracing is off (or starting them failed)."""
    if not tracing.enabled():
        return None
    with _never_raises(claim.job_id):
        return _start(claim, worker_id, deployment_id, claim_started_ns)
    return None


def _start(
    claim: Claim, worker_id: str, deployment_id: str | None, claim_started_ns: int
) -> JobTrace | None:
    job_id = claim.job_id
    model = claim.deployment
    ids = {
        tracing.JOB_ID: job_id,
        tracing.JOB_ATTEMPT: claim.attempt,
        tracing.WORKER_ID: worker_id,
        tracing.DEPLOYMENT_ID: deployment_id,
        tracing.GEN_AI_MODEL: model,
    }
    run = tracing.start_span(
        "job.run",
        parent=tracing.context_of(claim.traceparent),
        kind="consumer",
        attributes=ids,
        start_ns=claim_started_ns,
    )
    if run is None:
        return None
    claimed = tracing.start_span(
        "job.claim",
        parent=tracing.parent_of(run),
        kind="client",
        attributes={tracing.JOB_ID: job_id},
        start_ns=claim_started_ns,
    )
    if claimed is not None:
        claimed.end(end_time=time.time_ns())
    return JobTrace(run, model or None, job_id)

"""Traces (OpenTelemetry) of every platform process: one job's spans from the API request through
its queue, the worker's claim, the engine's run and the completion report (docs/observability.md
"Traces").

Shared by the API and the workers, like `common/logs.py` (the worker never imports the control
plane). Off by default (`PLATFORM_OTEL_EXPORTER=none`): then nothing of OpenTelemetry is even
imported, every function here returns at once (`None`, or a no-op), the API adds no middleware
and jobs store no `traceparent`. On (`otlp`), each process exports its spans in batches over
OTLP/HTTP to the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (the `otlp` extra holds the exporter).

Context crosses processes as a W3C `traceparent`: in the `traceparent` header of an HTTP request
(a caller's, a worker's report), and stored with the job (`jobs.traceparent`, written by the same
INSERT as the job), which the claim hands to whichever worker runs it, so a redispatched wake-up
or a retried attempt joins the same trace.

NOTE: spans carry ids, counts, times and reasons only, never prompt or output text, and an
exception only as its type (its message may quote input).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

# Attributes: the OpenTelemetry GenAI semantic conventions where they fit, the platform's ids.
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_MODEL = "gen_ai.request.model"  # the deployment's name
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
OPERATION = "text_completion"  # every job is a prompt in, text out
JOB_ID = "platform.job.id"
JOB_KIND = "platform.job.kind"
JOB_ATTEMPT = "platform.job.attempt"
JOB_STATUS = "platform.job.status"
DEPLOYMENT_ID = "platform.deployment.id"
WORKER_ID = "platform.worker.id"
REQUEST_ID = "platform.request.id"
ERROR_TYPE = "error.type"

log = logging.getLogger(__name__)
TRACEPARENT = "traceparent"
_OTLP_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


class TraceSettings(BaseSettings):
    """The trace settings of every process (env prefix `PLATFORM_`), e.g.
    `PLATFORM_OTEL_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318`."""

    model_config = SettingsConfigDict(env_prefix="PLATFORM_", frozen=True, extra="ignore")

    # "none": no traces (nothing recorded, nothing imported); "otlp": spans exported over
    # OTLP/HTTP as the standard OTEL_EXPORTER_OTLP_* variables say (needs the `otlp` extra).
    otel_exporter: Literal["none", "otlp"] = "none"


class TracingUnavailable(RuntimeError):
    """Traces were asked for, but the exporter's package is not installed."""


_tracer: Tracer | None = None  # None: tracing is off


def enabled() -> bool:
    return _tracer is not None


def configure(component: str, settings: TraceSettings) -> None:
    """Export this process's spans as `settings` say; call it once, at the entry point, after
    `logs.configure`. Raises TracingUnavailable if the exporter is not installed."""
    if settings.otel_exporter == "none":
        return
    try:
        import importlib

        exporter_cls = importlib.import_module(_OTLP_MODULE).OTLPSpanExporter
    except ImportError as exc:
        raise TracingUnavailable(
            "PLATFORM_OTEL_EXPORTER=otlp needs the OTLP exporter: "
            "pip install 'platform-serverless[otlp]' (opentelemetry-exporter-otlp-proto-http)"
        ) from exc
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME wins; else platform-api, platform-worker, ...
    name = os.environ.get("OTEL_SERVICE_NAME") or f"platform-{component}"
    # the sampler: OTEL_TRACES_SAMPLER (default: parent-based, always on)
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(exporter_cls()))  # endpoint: OTEL_EXPORTER_*
    install(provider)
    atexit.register(provider.shutdown)  # the last batch is sent at exit


def install(provider: TracerProvider | None) -> None:
    """Record spans with `provider` (None: off again). The entry point's `configure` calls it;
    tests pass a provider with an in-memory exporter."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer("platform-serverless")


def tracer() -> Tracer | None:
    return _tracer


# --- context ----------------------------------------------------------------------------------


def context_of(traceparent: str | bytes | None) -> Context | None:
    """The remote parent a `traceparent` names; None when tracing is off, and an empty
    context (a new trace) when it is missing or malformed: a bad header is ignored."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if isinstance(traceparent, bytes):
        traceparent = traceparent.decode("latin-1")
    carrier = {TRACEPARENT: traceparent} if traceparent else {}
    return TraceContextTextMapPropagator().extract(carrier)


def traceparent_of(span: Span | None) -> str | None:
    """The `traceparent` of `span` (None when tracing is off or it has no valid context)."""
    if span is None or not span.get_span_context().is_valid:
        return None
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def current_traceparent() -> str | None:
    """The `traceparent` of the span current in this context (what a new job stores)."""
    if _tracer is None:
        return None
    from opentelemetry.trace import get_current_span

    return traceparent_of(get_current_span())


def ids_of(span: Span | None) -> dict[str, str]:
    """`{"trace_id", "span_id"}` of `span` as log lines carry them (lowercase hex, as in a
    `traceparent` and every tracing backend's search box); empty for no span or an invalid one."""
    if span is None:
        return {}
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


def current_ids() -> dict[str, str]:
    """`ids_of` the span current in this context: what a log line written here carries."""
    if _tracer is None:
        return {}
    from opentelemetry.trace import get_current_span

    return ids_of(get_current_span())


def parent_of(span: Span) -> Context:
    from opentelemetry.trace import set_span_in_context

    return set_span_in_context(span)


# --- spans ------------------------------------------------------------------------------------


Kind = Literal["internal", "server", "client", "consumer"]


def start_span(
    name: str,
    *,
    parent: Context | None = None,
    kind: Kind = "internal",
    attributes: Mapping[str, Any] | None = None,
    start_ns: int | None = None,
) -> Span | None:
    """A started span (ended by the caller), or None when tracing is off. `parent` None: the
    span current in this context."""
    if _tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(
        name,
        context=parent,
        kind=SpanKind[kind.upper()],
        attributes=_clean(attributes),
        start_time=start_ns,
    )


@contextlib.contextmanager
def span(
    name: str,
    *,
    parent: Context | None = None,
    kind: Kind = "internal",
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span | None]:
    """A span current for the block (None when tracing is off); an exception marks it failed
    with its type only."""
    s = start_span(name, parent=parent, kind=kind, attributes=attributes)
    if s is None:
        yield None
        return
    from opentelemetry.trace import use_span

    try:
        with use_span(s, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield s
    except BaseException as exc:
        failed(s, type(exc).__name__)
        raise
    finally:
        s.end()


def record_span(
    name: str,
    parent: str | Context | None,
    start: datetime,
    end: datetime,
    attributes: Mapping[str, Any] | None = None,
) -> Context | None:
    """A span that happened between `start` and `end` (a job's wait in its queue), under
    `parent` (a `traceparent`, or a context this returned: the span to record children under);
    nothing, and None, when tracing is off or it could not be recorded."""
    if _tracer is None:
        return None
    try:
        under = context_of(parent) if parent is None or isinstance(parent, str) else parent
        s = start_span(name, parent=under, attributes=attributes, start_ns=ns_of(start))
        if s is None:
            return None
        s.end(end_time=max(ns_of(end), ns_of(start)))
        return parent_of(s)
    except Exception:  # called after a commit: a trace never fails the request
        log.warning("could not record span %s", name, exc_info=True)
        return None


def failed(s: Span, error_type: str) -> None:
    """Mark a span failed, naming the error's type (never its message)."""
    from opentelemetry.trace import Status, StatusCode

    s.set_attribute(ERROR_TYPE, error_type)
    s.set_status(Status(StatusCode.ERROR, error_type))


def ns_of(at: datetime) -> int:
    return int(at.timestamp() * 1e9)


def epoch_ns_of_monotonic(t: float) -> int:
    """A `time.monotonic()` reading (the engine's clock) as nanoseconds since the epoch."""
    return time.time_ns() - time.monotonic_ns() + int(t * 1e9)


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Attributes without the None values (OpenTelemetry refuses them)."""
    if not attributes:
        return None
    return {k: v for k, v in attributes.items() if v is not None}

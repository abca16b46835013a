"""The control plane's event families: counters and histograms observed where things happen.

    job ended            services/jobs/finish.finish, after its commit (every terminal path)
    request answered     api/request_log.RequestLog (ASGI, outermost)
    startup phase ended  services/workers/worker_records.transition, after the commit
    cold start placed    reconcile/actuator.Actuator (a StartWorker), after the commit
    segment billed       services/workers/billing.close_segment, after the commit
    webhook attempt      services/jobs/webhook_delivery.deliver, after its commit

Every control-plane process (API, reconciler, Celery worker) observes into these. With
PROMETHEUS_MULTIPROC_DIR set (the same directory for every control-plane process of one host,
emptied before they start: docs/observability.md), each process writes its own files there and
any API process's /metrics adds them all up; without it, /metrics shows the answering
process's own (one API process, the reconciler's and Celery's events not included).

Labels are bounded: deployment names with their tenant ids (names are unique per tenant only),
kinds, statuses, phases, accelerators, tiers, outcomes, route templates — never a job id, a
prompt or an output. An observation never fails what it counts (`_guarded`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec

from prometheus_client import Counter, Histogram, disable_created_metrics

if TYPE_CHECKING:
    from control_plane.db.models import Job

log = logging.getLogger(__name__)

# No `*_created` series beside each counter and histogram (multiprocess mode has none
# either): one series per label set is enough.
disable_created_metrics()  # type: ignore[no-untyped-call]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
if os.environ.get(MULTIPROC_ENV):
    # prometheus_client writes a file there at the first observation of each process.
    os.makedirs(os.environ[MULTIPROC_ENV], exist_ok=True)

# From a warm sync call (tens of ms) to a cold start of a large model (minutes).
LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
# Gaps between tokens: a GPU decode step (ms) to a CPU one under load (a second).
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
PHASE_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

JOB = ("deployment", "tenant", "kind")

JOBS_ENDED = Counter(
    "platform_jobs_ended_total", "Jobs that reached a terminal status.", [*JOB, "status"]
)
JOB_QUEUE_DELAY = Histogram(
    "platform_job_queue_delay_seconds",
    "Created to first claimed by a worker (a cold start's wait included), per job that ran.",
    JOB,
    buckets=LATENCY_BUCKETS_S,
)
JOB_TTFT = Histogram(
    "platform_job_time_to_first_token_seconds",
    "Created to first token: the wait for its claim plus the engine's time to first token "
    "(succeeded jobs, first attempt).",
    JOB,
    buckets=LATENCY_BUCKETS_S,
)
JOB_E2E = Histogram(
    "platform_job_e2e_latency_seconds",
    "Created to terminal status, per job.",
    [*JOB, "status"],
    buckets=LATENCY_BUCKETS_S,
)
JOB_ITL = Histogram(
    "platform_job_mean_inter_token_latency_seconds",
    "Per succeeded job: its mean gap between generated tokens (workers export every gap).",
    JOB,
    buckets=ITL_BUCKETS_S,
)
JOBS_HANDED_OFF = Counter(
    "platform_jobs_handed_off_total",
    "Jobs claimed for a worker with a free slot at their admission and handed to it (no claim "
    "request); the others waited in the queue for a worker's claim.",
    JOB,
)
HTTP_REQUESTS = Counter(
    "platform_http_requests_total",
    "HTTP requests answered by the API, by route template and status code.",
    ["method", "route", "status"],
)
HTTP_REQUEST_SECONDS = Histogram(
    "platform_http_request_duration_seconds",
    "Seconds the API took to answer, by route template: until the response ended (a streamed "
    "answer's whole length).",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
WORKER_FAILURES = Counter(
    "platform_worker_failures_total",
    "Workers that ended failed, by accelerator and kind of reason (failure_kind: exit, "
    "exception, boot_timeout, heartbeat_lost, image_pull, pod_config, unschedulable, ...).",
    ["accelerator", "reason"],
)
COLD_STARTS = Counter(
    "platform_cold_starts_total",
    "Workers started for a deployment, by where they came from (placement tier).",
    ["accelerator", "tier"],
)
STARTUP_PHASE = Histogram(
    "platform_cold_start_phase_seconds",
    "Seconds a deployment's worker spent in each start-up phase it completed.",
    ["phase", "accelerator", "deployment", "tenant"],
    buckets=PHASE_BUCKETS_S,
)
BILLED_SECONDS = Counter(
    "platform_billed_seconds_total",
    "Worker seconds billed (after the boot cap), by phase, as segments are recorded.",
    ["phase", "accelerator"],
)
WEBHOOK_DELIVERIES = Counter(
    "platform_webhook_deliveries_total",
    "Webhook delivery attempts by event type and outcome (delivered, retrying, failed).",
    ["event", "outcome"],
)

P = ParamSpec("P")


def _guarded(fn: Callable[P, None]) -> Callable[P, None]:
    @functools.wraps(fn)
    def observe(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:  # e.g. the multiprocess directory gone: the job still ends
            log.exception("metrics: %s failed", fn.__name__)

    return observe


@dataclass(frozen=True, slots=True)
class JobTimes:
    """What a job's own timestamps (and its worker's reported timings) say, in seconds."""

    queue_s: float | None  # created → first claim (None: it never ran)
    e2e_s: float | None  # created → ended (None: no end time)
    ttft_s: float | None  # created → first token (None: unknown)
    mean_itl_s: float | None  # mean gap between its tokens (None: unknown)


def job_times(
    created_at: datetime,
    started_at: datetime | None,
    completed_at: datetime | None,
    attempt: int,
    status: str,
    output: dict[str, Any] | None,
) -> JobTimes:
    """Pure: the latencies of one ended job.

    The time to first token adds the engine's (from the worker's `timings`, engine arrival →
    first token) to the wait for the claim; only for a first attempt, as `started_at` is the
    first claim and a retried job's lost attempt is not in either number.
    """
    queue_s = _seconds(created_at, started_at)
    timings = (output or {}).get("timings") if status == "succeeded" else None
    timings = timings if isinstance(timings, dict) else {}
    engine_ttft = _number(timings.get("ttft_s"))
    ttft_s = None
    if queue_s is not None and engine_ttft is not None and attempt == 1:
        ttft_s = queue_s + engine_ttft
    return JobTimes(
        queue_s=queue_s,
        e2e_s=_seconds(created_at, completed_at),
        ttft_s=ttft_s,
        mean_itl_s=_number(timings.get("itl_mean_s")),
    )


def _seconds(start: datetime, end: datetime | None) -> float | None:
    return None if end is None else max((end - start).total_seconds(), 0.0)


def _number(value: object) -> float | None:
    """A non-negative finite number from the worker's JSON, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


@_guarded
def job_ended(job: Job) -> None:
    """A job reached its terminal status (its row committed)."""
    labels = (job.deployment_name, job.tenant_id, job.kind)
    times = job_times(
        job.created_at, job.started_at, job.completed_at, job.attempt, job.status, job.output
    )
    JOBS_ENDED.labels(*labels, job.status).inc()
    if times.e2e_s is not None:
        JOB_E2E.labels(*labels, job.status).observe(times.e2e_s)
    if times.queue_s is not None:
        JOB_QUEUE_DELAY.labels(*labels).observe(times.queue_s)
    if times.ttft_s is not None:
        JOB_TTFT.labels(*labels).observe(times.ttft_s)
    if times.mean_itl_s is not None:
        JOB_ITL.labels(*labels).observe(times.mean_itl_s)


@_guarded
def job_handed_off(job: Job) -> None:
    """A job was claimed for a worker at its admission (committed)."""
    JOBS_HANDED_OFF.labels(job.deployment_name, job.tenant_id, job.kind).inc()


@_guarded
def http_request(method: str, route: str, status: int, seconds: float | None = None) -> None:
    HTTP_REQUESTS.labels(method, route, str(status)).inc()
    if seconds is not None:
        HTTP_REQUEST_SECONDS.labels(method, route).observe(max(seconds, 0.0))


# Reasons a worker fails with whose words are the kind itself (the rest: `exit_<code>`,
# `<kind>: <detail>` from the Kubernetes provider, or a reported exception's text).
_PLAIN_KINDS = frozenset(
    {"boot_timeout", "heartbeat_lost", "assignment_not_sent", "platform_shutdown"}
)
_PREFIXED_KINDS = ("image_pull", "pod_config", "unschedulable")


def failure_kind(reason: str | None) -> str:
    """A failed worker's reason as a label of few values (pure)."""
    if not reason:
        return "unknown"
    if reason in _PLAIN_KINDS:
        return reason
    if reason.startswith("exit_"):
        return "exit"
    for kind in _PREFIXED_KINDS:
        if reason.startswith(kind + ":"):
            return kind
    return "exception"  # what the worker reported: `<ExceptionType>: <message>`


@_guarded
def worker_failed(accelerator: str, reason: str | None) -> None:
    WORKER_FAILURES.labels(accelerator, failure_kind(reason)).inc()


@_guarded
def cold_start(accelerator: str, tier: str) -> None:
    COLD_STARTS.labels(accelerator, tier).inc()


@_guarded
def startup_phase(
    phase: str, accelerator: str, deployment: str, tenant: str, seconds: float
) -> None:
    STARTUP_PHASE.labels(phase, accelerator, deployment, tenant).observe(max(seconds, 0.0))


@_guarded
def billed(phase: str, accelerator: str, seconds: float) -> None:
    BILLED_SECONDS.labels(phase, accelerator).inc(max(seconds, 0.0))


@_guarded
def webhook_attempt(event_type: str, outcome: str) -> None:
    WEBHOOK_DELIVERIES.labels(event_type, outcome).inc()

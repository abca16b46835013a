"""Wire contract between the control plane and workers.

Both sides import this module (it imports nothing heavy), so a name used on the wire is
written once. Every Redis key of the platform is defined here (STYLE 7: one module for keys).

Flow of one job:

    control plane                         Redis / broker                      worker
    ─────────────                         ──────────────                      ──────
    commit job row (queued)
    send_task(RUN_JOB_TASK, queue=deployment_queue(dep))  ──────────────▶  consume (ack late)
                                                                           POST claim_path(job)
    UPDATE job → running, attempt+1  ◀─────────────────────────────────────  (fenced by attempt)
                                          XADD job_events_key(job) ◀──────  output deltas
    UPDATE job → succeeded|failed    ◀─────────────────────────────────────  POST complete_path
    XADD completed / failed, webhook task                                   ack the message

Claims (and reports) that wait at the same time travel together: CLAIMS_PATH, REPORTS_PATH.
"""

from __future__ import annotations

import base64
import binascii
import json
from enum import StrEnum
from typing import Any

KEY_PREFIX = "platform"

# Environment variables with these prefixes reach workers unchanged (engine and loader
# tuning, log and trace settings, read by worker.settings.WorkerSettings); the control
# plane's other PLATFORM_* settings (secrets among them) do not.
WORKER_ENV_PREFIXES = ("PLATFORM_ENGINE_", "PLATFORM_LOADER_", "PLATFORM_LOG_", "PLATFORM_OTEL_")

# The environment variables that carry storage credentials. A worker's come only from the
# control plane's `storage.Access` for its model, never from the control plane's environment.
CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)

# The host-memory weight tier's default home (shared memory, on every Linux host): the worker
# keeps its tier there unless PLATFORM_LOADER_HOST_CACHE_DIR says otherwise, and a pod provider
# mounts a memory volume at the same place.
HOST_CACHE_DIR = "/dev/shm/platform-weights"

# Celery task name the control plane sends and workers consume (kombu, Celery protocol v2).
RUN_JOB_TASK = "worker.run_job"

# Broker priority of a job's wake-up per kind (lower = served first: sync, async, batch); the
# worker passes it on as the engine's scheduling class, and queue positions rank by it.
PRIORITY_OF_KIND = {"sync": 0, "async": 3, "batch": 6}

# Broker transport options both producer and consumer must share: Redis has no native
# priorities, so kombu keeps one list per priority step and polls them in order.
PRIORITY_STEPS = list(range(10))
BROKER_TRANSPORT_OPTIONS = {"priority_steps": PRIORITY_STEPS, "queue_order_strategy": "priority"}
# kombu's Redis transport: a queue's list for priority step p > 0 is "<queue>\x06\x16<p>"; a
# delivered message waits for its ack in the hash UNACKED_KEY (delivery tag → [payload,
# exchange, routing key]) and the sorted set UNACKED_INDEX_KEY (delivery tag → delivered at).
KOMBU_PRIORITY_SEP = "\x06\x16"
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"


def priority_key(queue: str, priority: int) -> str:
    """The Redis list of `queue`'s wake-ups of broker priority `priority` (a step)."""
    return f"{queue}{KOMBU_PRIORITY_SEP}{priority}" if priority else queue


def queue_keys(queue: str) -> list[str]:
    """`queue`'s lists, the first served first."""
    return [priority_key(queue, p) for p in PRIORITY_STEPS]


def job_id_of(body: Any, headers: dict[str, Any]) -> str | None:
    """Job id of a Celery protocol-v2 body `[args, kwargs, embed]` for RUN_JOB_TASK."""
    if headers.get("task") != RUN_JOB_TASK:
        return None
    if isinstance(body, list | tuple) and len(body) >= 2 and isinstance(body[1], dict):
        job_id = body[1].get("job_id")
        return job_id if isinstance(job_id, str) and job_id else None
    return None


def job_of_message(payload: Any) -> str | None:
    """The job id of a job's wake-up as kombu's Redis transport keeps it (headers, properties,
    a body base64-encoded or not), as the worker reads it from its queue and the control plane
    from the `unacked` notes; None for any other message, or a malformed one."""
    try:
        headers = payload.get("headers") or {}
        if headers.get("task") != RUN_JOB_TASK:
            return None
        body = payload.get("body")
        if (payload.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        return job_id_of(json.loads(body), headers)
    except (ValueError, TypeError, AttributeError, binascii.Error):
        return None


# How long a job's event stream is kept after its last write while the job is active, and
# after its terminal event: its readers (a stream's client, the output-webhook follower) are
# attached while it runs, so an ended job's events are kept only for a late reader; at hundreds
# of jobs a second a day of them would be gigabytes of Redis.
JOB_EVENTS_TTL_S = 24 * 3600
JOB_EVENTS_ENDED_TTL_S = 3600
# Cap on entries per job stream (approximate trim); deltas beyond it are still in the output.
JOB_EVENTS_MAXLEN = 10_000
# A worker refreshes its heartbeat every HEARTBEAT_INTERVAL_S; it expires after HEARTBEAT_TTL_S.
HEARTBEAT_INTERVAL_S = 2.0
HEARTBEAT_TTL_S = 10


def deployment_queue(deployment_id: str) -> str:
    """Broker queue that wakes the workers of one deployment."""
    return f"{KEY_PREFIX}.deployment.{deployment_id}"


def job_events_key(job_id: str) -> str:
    """Redis Stream of a job's events (state changes and output deltas)."""
    return f"{KEY_PREFIX}:job:{job_id}:events"


def job_end_key(job_id: str) -> str:
    """A sync job's end for its waiters: a list holding the job as it ended (one element)."""
    return f"{KEY_PREFIX}:job:{job_id}:end"


# A sync job's end is kept this long: a waiter blocked on it wakes at once, and one that comes
# after the end finds the job terminal when it is admitted (a replay), so it is read only
# in the moment between the admission and the wait.
JOB_END_TTL_S = 60


# A cancel flag outlives any execution limit (86,400 s at most), so a worker always sees it.
CANCEL_FLAG_TTL_S = 24 * 3600


def job_cancel_key(job_id: str) -> str:
    """Set when a job is canceled; a worker polls it between steps and stops the job."""
    return f"{KEY_PREFIX}:job:{job_id}:cancel"


def worker_heartbeat_key(worker_id: str) -> str:
    """JSON heartbeat of one worker (state, deployment, in-flight jobs), with a TTL."""
    return f"{KEY_PREFIX}:worker:{worker_id}:heartbeat"


# While a worker loads weights its heartbeat also carries {"bytes_done", "bytes_total"} under
# this field, refreshed at most every PROGRESS_BEAT_S (the reconciler turns it into a cold
# start's phase and ETA).
HEARTBEAT_PROGRESS_FIELD = "progress"
PROGRESS_BEAT_S = 0.25
# A warm-pool worker's heartbeat also carries its host's name and the object URIs its host-memory
# weight tier holds (complete entries): placement prefers a host that holds the model.
HEARTBEAT_HOST_FIELD = "host"
HEARTBEAT_HOST_TIER_FIELD = "host_tier"
# A worker serving its own /metrics puts the address it bound ("host:port") under this field:
# the control plane lists it for Prometheus (`GET /metrics/workers`, HTTP service discovery).
HEARTBEAT_METRICS_FIELD = "metrics"
# Where a worker serves its /metrics: set by its provider (the local one: loopback and a free
# port; in a pod: the pod IP); unset, the worker serves none.
METRICS_HOST_ENV = "PLATFORM_WORKER_METRICS_HOST"
METRICS_PORT_ENV = "PLATFORM_WORKER_METRICS_PORT"


# The platform's worker's heartbeat also lists the ids of the jobs it holds (handed to it or
# claimed, not yet reported) under this field: a job the database gives it and it does not
# hold was never received (`reconcile/jobs.requeue_unheld`).
HEARTBEAT_JOBS_FIELD = "jobs"


def worker_handoffs_key(worker_id: str) -> str:
    """List of the jobs handed to one worker at admission
    (`control_plane/services/jobs/handoff.py`), each already committed as the worker's: a claim's
    answer with the job's broker priority. The worker pops them with its queue's wake-ups, before
    them."""
    return f"{KEY_PREFIX}:worker:{worker_id}:handoffs"


# A hand-off nobody popped expires with its list (its worker is gone: its jobs were requeued).
HANDOFF_TTL_S = 3600


def worker_assignment_key(worker_id: str) -> str:
    """List holding the one `Assignment` of a warm-pool worker (it pops it, then serves)."""
    return f"{KEY_PREFIX}:worker:{worker_id}:assignment"


# An assignment nobody popped expires (its worker died; the reconciler fails that worker on
# its heartbeat and assigns another).
ASSIGNMENT_TTL_S = 120


def rate_limit_key(tenant_id: str, kind: str) -> str:
    """Token bucket of one tenant for one kind of limit (requests, tokens)."""
    return f"{KEY_PREFIX}:ratelimit:{tenant_id}:{kind}"


# The autoscaler's keys (control plane only; written at admission and by the reconciler,
# `control_plane/services/scaling/arrivals.py` and `scale_decisions.py`).


def arrival_buckets_key(deployment_id: str) -> str:
    """Hash: 10 s bucket index (seconds since the epoch // BUCKET_S) → arrivals in it."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:arrivals:buckets"


def arrival_gaps_key(deployment_id: str) -> str:
    """List: the latest seconds between consecutive arrivals, oldest first (bounded)."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:arrivals:gaps"


def arrival_idle_gaps_key(deployment_id: str) -> str:
    """List: the latest gaps between arrivals of at least `IDLE_GAP_S`, oldest first (bounded;
    they outlast the gaps list in a deployment called in batches)."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:arrivals:idle_gaps"


def last_arrival_key(deployment_id: str) -> str:
    """String: the time of the latest arrival (seconds since the epoch)."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:arrivals:last"


def in_flight_key(deployment_id: str) -> str:
    """Integer: the deployment's jobs in flight (queued + running) as admissions and ends move
    them, set to the database's count by each reconciler tick."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:arrivals:in_flight"


def peak_in_flight_key(deployment_id: str) -> str:
    """Integer: the most jobs in flight at any admission since the reconciler's last tick."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:arrivals:peak"


def scale_decision_key(deployment_id: str) -> str:
    """JSON of the autoscaler's latest decision for one deployment (with a TTL)."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:scaling"


def cold_start_key(deployment_id: str) -> str:
    """JSON of a deployment's cold start under way (phase, bytes, ETA), with a short TTL: what
    `GET /v1/jobs/{id}` shows a job waiting on that worker."""
    return f"{KEY_PREFIX}:deployment:{deployment_id}:cold_start"


# The control plane's own keys.

# Counter bumped by every write to an API key, a deployment or a tenant: each API process keeps
# those in memory and checks the generation on every request (`services/tenants/edge_cache.py`).
EDGE_CACHE_GENERATION_KEY = f"{KEY_PREFIX}:edge-cache:generation"
# The reconciler's lease outside Kubernetes: the holder's name, with a TTL it renews.
RECONCILER_LEASE_KEY = f"{KEY_PREFIX}:reconciler:lease"


def webhook_resent_key(subject_id: str) -> str:
    """Set (with a TTL) when a job's or batch's lost `*.completed` webhook was sent again, so
    a sweep does not send it again before its next attempt is due (`reconcile/webhooks.py`)."""
    return f"{KEY_PREFIX}:webhook-resent:{subject_id}"


# Hash: decision reason → decisions taken with it, over all deployments (a counter for /metrics).
SCALE_DECISIONS_KEY = f"{KEY_PREFIX}:scaling:decisions"
# List: pushed at admission when the called deployment has no worker (its latest decision
# counts none): the reconciler pops it to tick at once rather than at its next interval, so a
# cold start does not begin with up to a tick of waiting.
RECONCILER_NUDGE_KEY = f"{KEY_PREFIX}:reconciler:nudge"


class EventType(StrEnum):
    """Types of entries in a job's event stream (the SSE event names)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    OUTPUT = "output"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    # Its ttl passed before it started.
    EXPIRED = "expired"
    # It ran past its execution limit.
    TIMED_OUT = "timed_out"
    # Never in Redis: sent by the API's SSE stream to a client whose text cannot be continued
    # (the job was run again and its new text differs): discard it, the text starts anew.
    RESTARTED = "restarted"


# One terminal event per terminal job status (`completed` is the event of `succeeded`).
TERMINAL_EVENTS = frozenset(
    {
        EventType.COMPLETED,
        EventType.FAILED,
        EventType.CANCELED,
        EventType.EXPIRED,
        EventType.TIMED_OUT,
    }
)


class WorkerState(StrEnum):
    """Lifecycle of a worker process; each state is also a billing phase (boot..drain)."""

    BOOTING = "booting"
    LOADING = "loading"
    WARMING = "warming"
    IDLE = "idle"
    BUSY = "busy"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


# Internal HTTP endpoints the worker calls on the control plane (bearer: the worker token).
def claim_path(job_id: str) -> str:
    return f"/internal/jobs/{job_id}/claim"


def complete_path(job_id: str) -> str:
    return f"/internal/jobs/{job_id}/complete"


# The same for several jobs in one request (`worker/runtime/batching.py`), answered per job.
CLAIMS_PATH = "/internal/jobs/claim"
REPORTS_PATH = "/internal/jobs/complete"
# The most jobs one of those requests may carry.
MAX_JOBS_PER_REQUEST = 64


def worker_state_path(worker_id: str) -> str:
    return f"/internal/workers/{worker_id}/state"

"""Pydantic shapes at the HTTP edge (requests). Responses are built by the services' to_public."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from control_plane.domain import uris
from control_plane.domain.spec import default_of
from control_plane.services.webhooks import WEBHOOK_EVENTS
from worker.protocol import MAX_JOBS_PER_REQUEST

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# A model URI's shape (its scheme, no control characters); domain/uris.py has the whole rule.
MODEL_URI_PATTERN = r"^(store|s3|hf|file)://[^\x00-\x1f\x7f]+$"
MAX_PROMPT_CHARS = 200_000


class SamplingDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=5)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: list[str] | None = Field(None, max_length=8)


class DeploymentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The patterns are documentation (clients and generated tests see the rule); the
    # validators below enforce it, with messages that say what is wrong.
    name: str = Field(
        description="lowercase letters, digits and '-', at most 63 characters",
        json_schema_extra={"pattern": NAME_RE.pattern},
    )
    model: str = Field(
        max_length=2_000,
        description="store://prefix/ (your namespace), s3://bucket/prefix/ (a bucket you "
        "registered credentials for), hf://org/repo[@rev]; file:///path for the operator only",
        json_schema_extra={"pattern": MODEL_URI_PATTERN},
    )
    # Defaults live in the domain's Spec; these shapes only add the bounds.
    accelerator: str = default_of("accelerator")
    accelerator_count: int = Field(default_of("accelerator_count"), ge=1, le=8)
    min_workers: int = Field(default_of("min_workers"), ge=0, le=64)
    max_workers: int = Field(default_of("max_workers"), ge=1, le=64)
    target_concurrency: int = Field(default_of("target_concurrency"), ge=1, le=256)
    scaledown_window_s: float = Field(default_of("scaledown_window_s"), ge=0, le=86_400)
    max_boot_s: float = Field(default_of("max_boot_s"), gt=0, le=3_600)
    cold_penalty_s: float = Field(default_of("cold_penalty_s"), ge=0, le=86_400)
    queue_wait_s: float = Field(default_of("queue_wait_s"), ge=0, le=3_600)
    execution_timeout_s: float = Field(default_of("execution_timeout_s"), gt=0, le=86_400)
    defaults: SamplingDefaults = Field(default_factory=SamplingDefaults)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be lowercase letters, digits and '-', starting alphanumeric")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        # The one parser of storage URIs; who may read it is checked by the route.
        try:
            uris.parse(v)
        except uris.UriError as exc:
            raise ValueError(exc.reason) from None
        return v

    @model_validator(mode="after")
    def _bounds(self) -> DeploymentSpec:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) exceeds max_workers ({self.max_workers})"
            )
        return self


class JobInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    max_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=5)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] | None = Field(None, max_length=8)

    def resolved(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """The input with the deployment's defaults, then the platform's, filled in."""
        out: dict[str, Any] = {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "stop": []}
        out.update({k: v for k, v in defaults.items() if v is not None})
        out.update({k: v for k, v in self.model_dump().items() if v is not None})
        return out


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: JobInput
    stream: bool = False
    wait_s: float | None = Field(None, gt=0)


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: JobInput
    webhook: str | None = Field(None, max_length=2_000)
    webhook_events: list[str] = Field(default_factory=lambda: ["completed"])
    ttl_s: float | None = Field(None, gt=0, le=7 * 86_400)
    # Overrides the deployment's execution_timeout_s for this job.
    execution_timeout_s: float | None = Field(None, gt=0, le=86_400)

    @field_validator("webhook_events")
    @classmethod
    def _events(cls, v: list[str]) -> list[str]:
        bad = sorted(set(v) - WEBHOOK_EVENTS)
        if bad:
            raise ValueError(f"unknown events {bad}; allowed: {sorted(WEBHOOK_EVENTS)}")
        return v


# Internal (worker → control plane) shapes.


class WorkerStateReport(BaseModel):
    state: str
    at: float = Field(description="unix time of the transition, seconds")
    reason: str | None = None
    # it pops jobs handed to it at admission (services/handoff.py); said once serving
    takes_handoffs: bool = False


class ClaimRequest(BaseModel):
    worker_id: str


class JobOutcome(BaseModel):
    """A job's outcome as its worker reports it (the fence: `attempt`)."""

    attempt: int
    status: str
    output: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None


class CompleteRequest(JobOutcome):
    worker_id: str


class ClaimManyRequest(BaseModel):
    worker_id: str
    job_ids: list[str] = Field(min_length=1, max_length=MAX_JOBS_PER_REQUEST)


class JobReport(JobOutcome):
    """One job's outcome in a report of several."""

    job_id: str
    traceparent: str | None = None  # the worker's report span: this job's request span joins it


class CompleteManyRequest(BaseModel):
    worker_id: str
    reports: list[JobReport] = Field(min_length=1, max_length=MAX_JOBS_PER_REQUEST)


# Response shapes (documented in the OpenAPI schema; secrets never appear in them).


class FieldError(BaseModel):
    field: str  # dotted path of the offending field ("input.max_tokens")
    message: str  # what is wrong, with the limits


class Problem(BaseModel):
    """RFC 7807 problem details; extra members (limit, job_id, ...) depend on the problem."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str
    errors: list[FieldError] | None = None


class ScalingIdleWindows(BaseModel):
    """Sparse traffic: when, counted from the last arrival, a worker is booted ahead of the
    next call and how long one is kept."""

    representative: bool = Field(
        description="false: fewer than 10 idle gaps between arrivals (longer than service_s), "
        "and not 3 that agree as a period; the scale-down window's keep-alive applies"
    )
    prewarm_s: float | None = Field(
        description="be ready this long after the last arrival (null: keep from the arrival)"
    )
    keepalive_s: float = Field(description="keep a worker until this long after it")
    wake_requests: float = Field(
        1.0,
        description="callers a cold start of the last worker makes wait, on average (arrivals "
        "within a boot of each wake): the cold start is priced at boot_s + this × cold_penalty_s",
    )
    keepalive_levels_s: list[float] = Field(
        default_factory=list,
        description="how long each worker a wake wants is kept (counted as keepalive_s is): "
        "the last worker's keepalive_s first, then one per further worker the recent wakes "
        "want, each for the ski-rental time of the callers it would serve; on the pre-warm "
        "plan (prewarm_s set), the workers booted ahead of the next wake, each kept until "
        "keepalive_s",
    )


class ScalingForecast(BaseModel):
    rate_per_s: float = Field(description="arrivals per second forecast now")
    rate_sd_per_s: float = Field(description="its standard deviation")


class ScalingPlacement(BaseModel):
    """Where the deployment's latest new worker came from (docs/architecture.md, warm pool)."""

    choice: str = Field(description="pool_host_tier | pool | boot: the option ready soonest")
    worker_id: str
    eta_s: float = Field(description="its estimated seconds to ready")
    options: dict[str, float] = Field(description="every option there was: estimated seconds")
    at: str


class ScalingStatus(BaseModel):
    """The autoscaler's latest decision for the deployment (docs/autoscaling.md)."""

    desired: int = Field(description="workers it should have, counting those still booting")
    actual: int = Field(description="workers that count now: ready + booting within max_boot_s")
    ready: int = Field(description="workers serving (idle or busy)")
    needed: int = Field(description="what this tick's signals asked for, before holding")
    reason: str = Field(description="the part that set `desired` (prewarm, keepalive, ...)")
    next_prewarm_at: str | None = Field(description="when a worker will boot ahead of traffic")
    decided_at: str
    queued: int = Field(description="jobs waiting for a worker")
    running: int = Field(description="jobs a worker holds")
    boot_s: float = Field(description="measured start → ready seconds (a prior until measured)")
    service_s: float = Field(description="mean seconds a job holds a worker slot")
    may_wait: float = Field(
        0.0,
        description="jobs the ready workers start within the deployment's queue_wait_s: so many "
        "may wait for them before another worker is asked for",
    )
    backlog_workers: int | None = Field(
        None,
        description="while workers boot: how many more the jobs present and those arriving "
        "over a boot need once a worker started now could be ready (those booting start their "
        "slots when ready and turn them over every service_s); null: none booting",
    )
    holds_s: list[float] = Field(
        default_factory=list,
        description="once no longer needed, how long each worker above the last is kept: [0] "
        "the second worker, [1] the third, ...: the ski-rental time of the callers that count "
        "of workers still held a boot after it was needed, min(boot_s + callers × "
        "cold_penalty_s, scaledown_window_s), or longer where it was needed again after gaps "
        "that cost less to hold through than to boot again; 0 where its past says it is not "
        "needed again within the window",
    )
    idle_windows: ScalingIdleWindows
    forecast: ScalingForecast | None = Field(description="null: too little history to forecast")
    recent_rate_per_s: float | None = Field(
        None,
        description="arrivals per second lately: the higher of the last 10 s bucket's and the "
        "mean over the last boot (null: no complete bucket yet)",
    )
    models_fitted_at: str | None = Field(description="when the models were last refit")
    placement: ScalingPlacement | None = Field(
        None, description="the latest worker started (null: none since the reconciler started)"
    )


class DeploymentPublic(DeploymentSpec):
    model_config = ConfigDict(extra="allow")

    id: str
    version: int
    created_at: str
    updated_at: str
    workers: dict[str, int]  # live workers by state
    # null: no decision in the last few minutes (new deployment, reconciler not running)
    scaling: ScalingStatus | None = None


class DeploymentList(BaseModel):
    data: list[DeploymentPublic]


class JobUsage(BaseModel):
    prompt_tokens: int | None
    generated_tokens: int | None
    queue_s: float | None
    execution_s: float | None


class ColdStartPublic(BaseModel):
    """The cold start a waiting job depends on: the worker expected ready first."""

    phase: str  # booting | assigning_warm_worker | loading_weights | warming
    eta_s: float | None  # seconds until that worker should be ready; null: not known yet
    bytes_done: int | None  # weight bytes landed (loading_weights only)
    bytes_total: int | None  # weight bytes to land


class JobPublic(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    deployment: str
    deployment_version: int
    kind: str
    status: str
    status_reason: str | None
    input: dict[str, Any]
    output: dict[str, Any] | None
    error: dict[str, Any] | None
    usage: JobUsage
    attempt: int
    webhook: str | None
    webhook_status: str
    created_at: str
    started_at: str | None
    completed_at: str | None
    queue_position: int | None = None
    eta_s: float | None = None
    cold_start: ColdStartPublic | None = None  # while it waits on a booting worker


class JobList(BaseModel):
    data: list[JobPublic]
    next_cursor: str | None


class BillingRecordPublic(BaseModel):
    id: int
    worker_id: str
    deployment: str
    deployment_version: int
    accelerator: str
    phase: str
    start: str
    end: str
    seconds: str  # decimal string, 3 places: wall time of the segment
    billed_seconds: str  # what is charged (boot beyond max_boot_s is not)
    note: str | None  # boot_cap, rolled (closed at the minute), heartbeat (closed at the last one)
    rate_per_s: str  # decimal string
    amount: str  # decimal string, 9 places


class UsagePublic(BaseModel):
    job_id: str
    deployment: str
    deployment_version: int
    api_key_id: str | None
    status: str
    created_at: str | None
    queue_s: float | None
    boot_wait_s: float
    execution_s: float | None
    billed_seconds: str  # decimal string
    prompt_tokens: int | None
    cached_tokens: int | None
    generated_tokens: int | None
    attempt: int
    workers: list[str]
    cost: str  # decimal string: this job's share of busy worker time


class UsageList(BaseModel):
    data: list[UsagePublic]
    next_cursor: str | None


class UsageGroup(BaseModel):
    group: str | None
    seconds: str
    amount: str


class UsageSummary(BaseModel):
    group_by: str
    data: list[UsageGroup]
    total_amount: str


class BillingCheck(BaseModel):
    ok: bool
    issues: list[dict[str, Any]]


class BillingRecordList(BaseModel):
    data: list[BillingRecordPublic]
    next_cursor: str | None


class WorkerPublic(BaseModel):
    id: str
    deployment: str
    deployment_version: int
    state: str
    reason: str | None
    accelerator: str
    started_at: str
    stopped_at: str | None


class WorkerList(BaseModel):
    data: list[WorkerPublic]


class PoolWorker(BaseModel):
    id: str
    accelerator: str
    state: str  # booting | idle (waiting for an assignment) | draining
    started_at: str
    state_since: str


class PoolView(BaseModel):
    """The warm pool (operator only): generic workers no deployment holds yet."""

    data: list[PoolWorker]
    counts: dict[str, dict[str, int]]  # accelerator → state → workers


class TimelinePhase(BaseModel):
    phase: str  # queue | boot | load | warm | run
    start: str
    end: str | None  # null: still going
    seconds: float  # up to `end`, or to the answer's `at` while still going
    worker_id: str | None
    attempt: int | None  # run: the attempt number
    outcome: str | None  # run: how the attempt ended (null while running)
    # boot/load/warm: the worker's billed amount for that time (decimal string; billed to the
    # tenant, not part of the job's share); run: the job's share of busy time (null until
    # allocated)
    amount: str | None
    billable: bool | None  # run: false for an attempt lost by the platform (not billed)


class TimelineCost(BaseModel):
    billed_seconds: str  # decimal string: the job's share of busy worker seconds
    amount: str  # decimal string: its cost
    allocated: bool  # false until the worker's busy segment closed and was shared out


class JobTimeline(BaseModel):
    job_id: str
    deployment: str
    status: str
    status_reason: str | None
    created_at: str
    completed_at: str | None
    at: str  # when this answer was made (open phases are counted to here)
    phases: list[TimelinePhase]
    cost: TimelineCost


class KeyPublic(BaseModel):
    id: str
    name: str
    prefix: str
    scopes: list[str]
    created_at: str
    revoked_at: str | None


class KeyCreated(KeyPublic):
    key: str  # the full secret key: shown in this answer only


class KeyList(BaseModel):
    data: list[KeyPublic]


class TenantPublic(BaseModel):
    id: str
    name: str
    requests_per_min: int | None
    tokens_per_min: int | None
    max_in_flight: int | None
    created_at: str


class TenantCreated(TenantPublic):
    admin_key: KeyCreated


class TenantList(BaseModel):
    data: list[TenantPublic]


class WebhookSecret(BaseModel):
    # signs messages to URLs that have no endpoint of their own
    secret: str
    # after a rotation the previous secret also signs until then (None: no previous one)
    previous_secret_expires_at: str | None = None

"""Pydantic shapes of the API's answers, as the OpenAPI schema documents them. The services build
the same documents as plain dicts on the hot paths (`to_public`); tests/unit/test_public_shapes.py
keeps the two equal."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.schemas import DeploymentSpec


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
    steady: bool = Field(
        default=False,
        description="a Poisson stream at a rate that all but stays put, over at least the "
        "scale-down window: the workers its swings alone needed go once the need is a boot "
        "old, unless needed again within the window (docs/autoscaling.md)",
    )


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
        description="how many more workers the jobs present and those arriving over a boot need "
        "once a worker started now could be ready (those booting start their slots when ready "
        "and turn them over every service_s), plus the levels kept from one need to the next; "
        "applies while workers boot, or with a forecast or a pre-warm plan; null otherwise",
    )
    holds_s: list[float] = Field(
        default_factory=list,
        description="once no longer needed, how long each worker above the last is kept: [0] "
        "the second worker, [1] the third, ...: the ski-rental time of the queueing it spared "
        "over a boot after it was needed, in callers waiting a whole boot, min(boot_s + "
        "callers × cold_penalty_s, scaledown_window_s), or longer where it was needed again "
        "after gaps that cost less to hold through than to boot again; 0 where its past says "
        "it is not "
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

    engine_resolved: Literal["builtin", "vllm"] = Field(
        description="the engine that serves it, chosen at deploy time from `engine` and the "
        "checkpoint (chosen again when the model, engine or accelerator_count change)"
    )
    engine_reason: str = Field(description="why that engine: for people, not parsed")
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
    engine: str = Field(description="the engine it runs: builtin | vllm (its deployment's)")
    started_at: str
    stopped_at: str | None


class WorkerList(BaseModel):
    data: list[WorkerPublic]


class PoolWorker(BaseModel):
    id: str
    accelerator: str
    # the engine it prepared at its boot: only deployments on that engine take it
    engine: str = Field(description="builtin | vllm: the deployments' engine it waits for")
    state: str  # booting | idle (waiting for an assignment) | draining
    started_at: str
    state_since: str


class PoolView(BaseModel):
    """The warm pool (operator only): generic workers no deployment holds yet, a pool per
    accelerator type and engine."""

    data: list[PoolWorker]
    counts: dict[str, dict[str, int]]  # accelerator → state → workers (all engines)
    # engine → accelerator → state → workers
    counts_by_engine: dict[str, dict[str, dict[str, int]]]


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

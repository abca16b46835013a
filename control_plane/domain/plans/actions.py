"""What a reconciler's plan asks the driver to do: a closed set of small values, each applied by
`reconcile/actuator.py` (the one place that starts and stops workers, writes the rows the tick
changes, and publishes what it changed). A plan never acts; the actuator never decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from control_plane.domain.endings import Ending
from control_plane.domain.placement import Placement

# Workers ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordExit:
    """A worker's process ended: `stopped` on exit code 0, else `failed` (`exit_<code>`). Its
    open billing segment ends at `ended_at`: the reap for a clean exit, the worker's last sign
    of life for any other (`note: heartbeat`)."""

    worker_id: str
    exit_code: int
    ended_at: datetime
    # why, when the exit code does not say (a pod that could not start); None: exit_<code>
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class NoteHeartbeat:
    """The worker's latest heartbeat, as of its own clock (never later than now)."""

    worker_id: str
    at: datetime


@dataclass(frozen=True, slots=True)
class LoseWorker:
    """Kill the worker and record it `failed`: it went silent or overran its boot. Its open
    billing segment ends at `ended_at`, its last sign of life."""

    worker_id: str
    deployment_id: str | None
    reason: str  # heartbeat_lost | boot_timeout
    ended_at: datetime


@dataclass(frozen=True, slots=True)
class StopWorker:
    """Drain the worker (it finishes what it holds, then exits); `reason` is recorded on it."""

    worker_id: str
    deployment_id: str | None
    reason: str  # fleet.STOP_REASONS, or the pool's shrink


@dataclass(frozen=True, slots=True)
class StartWorker:
    """A worker for the deployment: the idle pool worker `placement` chose, else a new boot
    (also when that pool worker was taken meanwhile)."""

    deployment_id: str
    reason: str  # the decision's reason
    placement: Placement


@dataclass(frozen=True, slots=True)
class BootPoolWorker:
    """Boot a warm-pool worker (no deployment) of this accelerator type and engine."""

    accelerator: str
    engine: str  # the engine it prepares at its boot (`domain.pool.ENGINES`)
    target: int  # the pool's target size for the type (for the log)
    why: str  # the target's reason
    expected_cold_starts: float


# Jobs ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HoldWaiting:
    """The deployment's waiting jobs are `starting` with `reason`; with `announce`, each also
    gets a `starting` event (they wait on the crash-loop gate, no cold start to report)."""

    deployment_id: str
    reason: str
    announce: bool


@dataclass(frozen=True, slots=True)
class FailWaiting:
    """The deployment's waiting jobs fail with `error`: its workers keep failing."""

    deployment_id: str
    deployment_name: str
    error: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TakeBack:
    """An attempt its worker lost (`ended_at`: where the worker's life ended): the attempt ends
    unbilled and the job goes back to the queue as a new attempt, unless it moved on."""

    job_id: str
    attempt: int
    ended_at: datetime
    reason: str  # worker_lost | handoff_lost


@dataclass(frozen=True, slots=True)
class EndJobs:
    """Jobs that end now, through the one path to a terminal state (`finish.finish`); an
    attempt listed in `lost` is closed unbilled first (`TakeBack`'s, out of retries)."""

    endings: tuple[tuple[str, Ending], ...]
    lost: tuple[tuple[str, int, datetime], ...] = ()


@dataclass(frozen=True, slots=True)
class Redispatch:
    """Send a waiting job's wake-up again (its queue is empty: the message was lost)."""

    job_id: str
    deployment_id: str
    kind: str


@dataclass(frozen=True, slots=True)
class ForgetWakeups:
    """Drop these delivery tags from the broker's unacked notes (nothing needs them)."""

    tags: tuple[str, ...]


# Batches, billing, webhooks --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DispatchLines:
    """Give `count` more of the batch's waiting lines a slot, and wake them."""

    batch_id: str
    deployment_id: str
    count: int


@dataclass(frozen=True, slots=True)
class CompleteBatch:
    """Every line ended: write the results, mark the batch completed, send its webhook."""

    batch_id: str


@dataclass(frozen=True, slots=True)
class RollSegment:
    """Close the worker's open billing segment at `end` (it continues in the same phase)."""

    worker_id: str
    phase: str
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class ResendWebhook:
    """Enqueue attempt `attempt` of a `*.completed` webhook whose delivery chain was lost."""

    subject_id: str  # a job or batch id
    event: str  # job.completed | batch.completed
    msg_id: str
    attempt: int


Action = (
    RecordExit
    | NoteHeartbeat
    | LoseWorker
    | StopWorker
    | StartWorker
    | BootPoolWorker
    | HoldWaiting
    | FailWaiting
    | TakeBack
    | EndJobs
    | Redispatch
    | ForgetWakeups
    | DispatchLines
    | CompleteBatch
    | RollSegment
    | ResendWebhook
)

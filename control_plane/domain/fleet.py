"""Pure policies over a deployment's workers: which to drain, which to stop first, which are
lost, and whether a job whose worker died gets another attempt.

The reconcilers (`control_plane/reconcile/`) read workers from SQL into `WorkerView`s, ask these
functions, and apply the answers through the provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from common.protocol import WorkerState

# A job whose worker died is tried this many times in all before it fails.
MAX_ATTEMPTS = 3
# Reasons a worker was asked to stop; a stopping worker is not counted as capacity.
NEW_VERSION, SCALE_DOWN, DEPLOYMENT_DELETED = (
    "new_version",
    "scale_down_window",
    "deployment_deleted",
)
STOP_REASONS = (NEW_VERSION, SCALE_DOWN, DEPLOYMENT_DELETED)
BOOTING_STATES = frozenset({WorkerState.BOOTING, WorkerState.LOADING, WorkerState.WARMING})
READY_STATES = frozenset({WorkerState.IDLE, WorkerState.BUSY})  # serving
# Scale-down order: idle workers first, then booting ones; a busy one last (it drains its jobs).
_STOP_ORDER = {WorkerState.IDLE: 0, **dict.fromkeys(BOOTING_STATES, 1), WorkerState.BUSY: 2}


@dataclass(frozen=True, slots=True)
class WorkerView:
    id: str  # worker id
    state: WorkerState  # current lifecycle state
    version: int  # deployment version it was started for
    reason: str | None  # why it was started or asked to stop


def to_drain(workers: list[WorkerView], version: int) -> list[WorkerView]:
    """Workers of an older spec version not yet asked to stop: they drain (finishing the jobs
    they hold) while workers of the current version take new work."""
    return [
        w
        for w in workers
        if w.version != version and w.state != WorkerState.DRAINING and w.reason != NEW_VERSION
    ]


def capacity(workers: list[WorkerView], version: int) -> list[WorkerView]:
    """Workers that count toward the desired number: of the current version, not stopping."""
    return [
        w
        for w in workers
        if w.state != WorkerState.DRAINING and w.version == version and w.reason != SCALE_DOWN
    ]


def scale_down_victims(active: list[WorkerView], desired: int) -> list[WorkerView]:
    """Which of `active` to stop to get down to `desired`: idle first, busy last (stable)."""
    surplus = len(active) - desired
    if surplus <= 0:
        return []
    return sorted(active, key=lambda w: _STOP_ORDER.get(w.state, 3))[:surplus]


@dataclass(frozen=True, slots=True)
class Liveness:
    reason: str | None  # boot_timeout | heartbeat_lost; None = alive
    ended_at: datetime  # where its open billing segment ends (last sign of life)


def liveness(
    state: WorkerState,
    started_at: datetime,
    state_since: datetime,
    last_heartbeat_at: datetime | None,
    has_heartbeat: bool,
    max_boot_s: float,
    heartbeat_grace_s: float,
    now: datetime,
) -> Liveness:
    """Is a live worker lost? One that overran `max_boot_s` while booting is; so is one with no
    heartbeat once it had `heartbeat_grace_s` to send one. A lost worker's time after its last
    heartbeat is not billed."""
    age_s = (now - started_at).total_seconds()
    if state in BOOTING_STATES and age_s > max_boot_s:
        return Liveness("boot_timeout", now)
    if not has_heartbeat and age_s > heartbeat_grace_s:
        return Liveness("heartbeat_lost", last_sign_of_life(last_heartbeat_at, state_since, now))
    return Liveness(None, now)


def last_sign_of_life(
    last_heartbeat_at: datetime | None,
    state_since: datetime,
    now: datetime,
    last_activity_at: datetime | None = None,
) -> datetime:
    """Where a dead worker's life (and its open billing segment) ends: the latest sign of life
    the control plane has of it, never after `now`. Its last heartbeat recorded; the start of
    its current state; `last_activity_at`, the latest claim or report of its jobs (a worker
    reports jobs between beats: a job it completed after its last recorded beat is billed in
    its segment)."""
    signs = [s for s in (last_heartbeat_at, state_since, last_activity_at) if s is not None]
    return min(max(signs), now)


def retries_left(attempt: int) -> bool:
    """Whether a job whose worker died on `attempt` is queued again (else it fails)."""
    return attempt < MAX_ATTEMPTS


@dataclass(frozen=True, slots=True)
class Held:
    """What a worker's latest heartbeat says it holds."""

    at: float  # the beat's own time (the worker's clock)
    job_ids: frozenset[str]  # the jobs handed to it or claimed, not yet reported


def unheld(
    running: list[tuple[str, int, str]],
    held: dict[str, Held],
    missing_since: dict[tuple[str, int], float],
    grace_s: float,
) -> tuple[list[tuple[str, int]], dict[tuple[str, int], float]]:
    """Running jobs their worker never received: (lost (job, attempt)s, the new `missing_since`).

    `running`: (job id, attempt, worker id) of the running jobs of workers that list what they
    hold; `held`: each such worker's latest beat (absent: no beat, nothing decided);
    `missing_since`: per attempt, the time of the first beat read (at a tick after the job was
    seen running) that did not list it. Every later beat was written after that tick's read of
    the database, so after the job was committed: an attempt still missing from a beat
    `grace_s` newer was never received (the push lost, or the API died before sending it). Only
    the worker's own clock is compared with itself.
    """
    lost: list[tuple[str, int]] = []
    still: dict[tuple[str, int], float] = {}
    for job_id, attempt, worker_id in running:
        beat = held.get(worker_id)
        if beat is None or job_id in beat.job_ids:
            continue
        key = (job_id, attempt)
        first = missing_since.get(key, beat.at)
        if beat.at - first >= grace_s:
            lost.append(key)
        else:
            still[key] = first
    return lost, still

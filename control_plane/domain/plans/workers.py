"""Plans of the worker reconcilers: record the processes that ended, and lose the workers that
went silent or overran their boot (`fleet.liveness`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from common.protocol import WorkerState
from control_plane.domain.fleet import last_sign_of_life, liveness
from control_plane.domain.plans.actions import LoseWorker, NoteHeartbeat, RecordExit


@dataclass(frozen=True, slots=True)
class LiveWorker:
    """A live worker as the liveness check sees it."""

    id: str
    deployment_id: str | None
    state: WorkerState
    started_at: datetime
    state_since: datetime
    last_heartbeat_at: datetime | None  # the latest beat recorded before this tick
    beat_at: datetime | None  # this tick's beat's own time; None: no beat in Redis
    max_boot_s: float  # its deployment's boot limit (the pool's for a pool worker)


@dataclass(frozen=True, slots=True)
class ExitedWorker:
    """A worker whose process ended, as the database knew it."""

    last_heartbeat_at: datetime | None  # the latest beat recorded before this tick
    state_since: datetime  # since when it is in its current state
    last_activity_at: datetime | None  # the latest claim or end of an attempt it ran


def plan_exits(
    exited: list[tuple[str, int]],
    known: dict[str, ExitedWorker],
    now: datetime,
    reasons: dict[str, str] | None = None,
) -> list[RecordExit]:
    """The exited processes (worker id, exit code) the database knows, recorded. A clean exit
    ends its worker now (it drained and reported `stopped` itself: this only confirms it); a
    crash or a kill ends it at its last sign of life (a heartbeat, a state, a job's claim or
    report), as a worker that went silent does: the time between then and the reap is not
    billed (docs/billing.md)."""
    out = []
    for worker_id, code in exited:
        w = known.get(worker_id)
        if w is None:
            continue
        ended_at = (
            now
            if code == 0
            else last_sign_of_life(w.last_heartbeat_at, w.state_since, now, w.last_activity_at)
        )
        out.append(RecordExit(worker_id, code, ended_at, (reasons or {}).get(worker_id)))
    return out


def plan_liveness(
    workers: list[LiveWorker], heartbeat_grace_s: float, now: datetime
) -> list[NoteHeartbeat | LoseWorker]:
    """Each beat noted (never earlier than the last one seen nor later than now); each worker
    that `fleet.liveness` says is lost, lost."""
    out: list[NoteHeartbeat | LoseWorker] = []
    for w in workers:
        last = w.last_heartbeat_at
        if w.beat_at is not None:
            last = min(max(w.beat_at, last or w.beat_at), now)
            out.append(NoteHeartbeat(w.id, last))
        verdict = liveness(
            w.state,
            w.started_at,
            w.state_since,
            last,
            w.beat_at is not None,
            w.max_boot_s,
            heartbeat_grace_s,
            now,
        )
        if verdict.reason is not None:
            out.append(LoseWorker(w.id, w.deployment_id, verdict.reason, verdict.ended_at))
    return out

"""Plans of the job reconcilers: attempts whose worker lost them go back to the queue (or fail
once they lost `fleet.MAX_ATTEMPTS`), pending jobs past their ttl expire, running jobs far past
their execution limit time out, lost wake-ups are sent again, and the broker's unacked notes
that nothing needs are forgotten (`wakeups.stale`)."""

from __future__ import annotations

from datetime import datetime

from control_plane.domain import endings
from control_plane.domain.fleet import retries_left
from control_plane.domain.plans.actions import EndJobs, ForgetWakeups, Redispatch, TakeBack
from control_plane.domain.wakeups import JobState, Unacked, stale

# A requeued (or failed) job's status_reason: its worker died, or never received it.
WORKER_LOST, HANDOFF_LOST = "worker_lost", "handoff_lost"
# What a job that lost too many attempts says, per reason.
LOST_HOW = {
    WORKER_LOST: "the worker running this job stopped",
    HANDOFF_LOST: "the job was not received by its worker",
}


def plan_take_back(lost: list[tuple[str, int, datetime]], reason: str) -> list[TakeBack | EndJobs]:
    """Attempts their worker lost (job id, attempt, when it ended): each job back in the queue
    as a new attempt, or failed once it lost MAX_ATTEMPTS (its lost attempt closed first)."""
    back: list[TakeBack | EndJobs] = []
    exhausted, closed = [], []
    for job_id, attempt, ended_at in lost:
        if retries_left(attempt):
            back.append(TakeBack(job_id, attempt, ended_at, reason))
            continue
        error = {"type": WORKER_LOST, "message": f"{LOST_HOW[reason]} {attempt} times"}
        exhausted.append((job_id, endings.failed(error, reason)))  # (only if still active)
        closed.append((job_id, attempt, ended_at))
    if exhausted:
        back.append(EndJobs(tuple(exhausted), lost=tuple(closed)))
    return back


def plan_expiry(overdue: list[str], overrunning: list[tuple[str, float]]) -> list[EndJobs]:
    """Pending jobs whose ttl passed expire; running jobs far past their limit time out."""
    ends = [(job_id, endings.expired()) for job_id in overdue]
    ends += [(job_id, endings.timed_out(limit_s)) for job_id, limit_s in overrunning]
    return [EndJobs(tuple(ends))] if ends else []


def plan_redispatch(
    waiting: list[tuple[str, str, str]], queue_empty: dict[str, bool]
) -> list[Redispatch]:
    """Wake-ups sent again where jobs (id, deployment, kind) wait but their deployment's queue
    is empty: the message was lost (a broker restart, a message dropped)."""
    return [Redispatch(j, d, k) for j, d, k in waiting if queue_empty.get(d, False)]


def plan_forget(
    entries: list[Unacked], states: dict[str, JobState], now_s: float, grace_s: float
) -> list[ForgetWakeups]:
    """The unacked wake-ups nothing needs, forgotten (kombu would redeliver them in an hour)."""
    tags = stale(entries, states, now_s, grace_s)
    return [ForgetWakeups(tuple(tags))] if tags else []

"""How a job ends: a terminal status with its reason, error or output, the states it may end
from, and for a worker's report the attempt that fences it. Pure values; `services/jobs/finish.py`
applies them (the one path to a terminal state).

    reported(...)   a worker's final report of an attempt (fenced: only while it runs)
    canceled(...)   a user's cancel of the job or its batch
    expired()       its ttl passed before a worker claimed it (pending only)
    timed_out(...)  it ran past its execution limit (running only)
    failed(...)     the platform gives up on it (crash loop, workers lost too often)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from control_plane.domain.states import ACTIVE, PENDING, TERMINAL, JobStatus


@dataclass(frozen=True, slots=True)
class Ending:
    """How a job ends. Build one with the constructors below rather than by hand."""

    status: JobStatus  # terminal status
    reason: str | None = None  # status_reason (ttl_passed, canceled_by_user, ...); None keeps it
    error: dict[str, Any] | None = None  # {"type", "message"} for failures
    output: dict[str, Any] | None = None  # the worker's output (text, finish_reason, ...)
    prompt_tokens: int | None = None  # reported by the worker
    generated_tokens: int | None = None  # reported by the worker
    # The fence of a worker's report: applies only to this attempt while it runs.
    attempt: int | None = None
    # States the job may end from (a running job never expires; a pending one never overruns).
    only_from: frozenset[JobStatus] = field(default=ACTIVE)


def reported(
    status: JobStatus,
    attempt: int,
    *,
    output: dict[str, Any] | None,
    error: dict[str, Any] | None,
    prompt_tokens: int | None,
    generated_tokens: int | None,
) -> Ending:
    """A worker's final report of `attempt` (fenced)."""
    if status not in TERMINAL:
        raise ValueError(f"{status} is not a terminal status")
    return Ending(
        status,
        error=error,
        output=output,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        attempt=attempt,
        only_from=frozenset({JobStatus.RUNNING}),
    )


def canceled(reason: str) -> Ending:
    """A user's cancel (of the job, or of its batch)."""
    return Ending(JobStatus.CANCELED, reason=reason)


def expired() -> Ending:
    """Its ttl passed before a worker claimed it."""
    return Ending(JobStatus.EXPIRED, reason="ttl_passed", only_from=PENDING)


def timed_out(limit_s: float) -> Ending:
    """It ran past its execution limit and the worker did not end it."""
    return Ending(
        JobStatus.TIMED_OUT,
        reason="execution_timeout",
        error={
            "type": "timed_out",
            "message": f"the job ran longer than its execution limit of {limit_s:g} s",
        },
        only_from=frozenset({JobStatus.RUNNING}),
    )


def failed(error: dict[str, Any], reason: str, *, pending_only: bool = False) -> Ending:
    """The platform gives up on it (crash loop, worker lost too often)."""
    return Ending(
        JobStatus.FAILED, reason=reason, error=error, only_from=PENDING if pending_only else ACTIVE
    )

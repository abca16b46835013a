"""Pydantic shapes of the internal routes a worker calls (`api/routes/internal.py`, the worker
token's): its state reports, its claims and its jobs' outcomes, one job or several at a time
(`common.protocol.CLAIMS_PATH`, `REPORTS_PATH`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from common.protocol import MAX_JOBS_PER_REQUEST


class WorkerStateReport(BaseModel):
    state: str
    at: float = Field(description="unix time of the transition, seconds")
    reason: str | None = None
    # it pops jobs handed to it at admission (services/jobs/handoff.py); said once serving
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

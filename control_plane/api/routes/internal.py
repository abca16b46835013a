"""Endpoints for workers (bearer: the worker token): claim, complete, lifecycle reports.

Workers hold no database credentials; every state change of a job or a worker goes through
here, so fencing and billing are enforced in one place.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from common import tracing
from common.protocol import REPORTS_PATH, EventType, WorkerState
from control_plane.api.context import Ctx, Db, Now, worker_auth
from control_plane.api.worker_schemas import (
    ClaimManyRequest,
    ClaimRequest,
    CompleteManyRequest,
    CompleteRequest,
    JobReport,
    WorkerStateReport,
)
from control_plane.context import AppContext
from control_plane.db.models import Job
from control_plane.domain import endings, user_paths
from control_plane.domain.states import PENDING, TERMINAL, JobStatus
from control_plane.errors import Conflict, InvalidRequest
from control_plane.services.jobs import claims, events, finish, job_store
from control_plane.services.workers import worker_records

log = logging.getLogger(__name__)
router = APIRouter(prefix="/internal", dependencies=[Depends(worker_auth)], include_in_schema=False)


# The two requests of every job (claim, complete) take one hop to a pool thread each: with a
# `Db` dependency FastAPI would also open and close the session on pool threads of their own.
# A worker sends the claims (and the reports) that wait together in one request of the routes
# for several jobs; those answer per job, in order, where the routes of one answer 409.


@router.post("/jobs/claim")
async def claim_many(body: ClaimManyRequest, ctx: Ctx, at: Now) -> Any:
    answers = await run_in_threadpool(_in_session, _claim, ctx, body.job_ids, body.worker_id, at)
    return {
        "claims": [
            c or {"job_id": j, "claimed": False} for j, c in zip(body.job_ids, answers, strict=True)
        ]
    }


@router.post("/jobs/{job_id}/claim")
async def claim(job_id: str, body: ClaimRequest, ctx: Ctx, at: Now) -> Any:
    answers = await run_in_threadpool(_in_session, _claim, ctx, [job_id], body.worker_id, at)
    return answers[0] or JSONResponse({"claimed": False}, status_code=409)


def _in_session(route: Callable[..., Any], ctx: AppContext, *args: Any) -> Any:
    """`route(ctx, session, *args)` with a session of its own, on the calling thread."""
    with ctx.sessions() as session:
        return route(ctx, session, *args)


def _claim(
    ctx: AppContext, session: Session, job_ids: list[str], worker_id: str, at: datetime
) -> list[dict[str, Any] | None]:
    """Each job given to `worker_id` (its claim's answer), or None, in one transaction."""
    expired: list[tuple[str, endings.Ending]] = []
    taken: list[tuple[Job, bool]] = []  # (job, claimed again by the worker that holds it)
    for job_id in job_ids:
        fresh = claims.claim_queued(session, job_id, worker_id, at)  # the warm path's claim
        if fresh is not None:
            taken.append((fresh, False))
            continue
        pending = session.get(Job, job_id)
        if pending is not None and pending.status in PENDING and job_store.ttl_passed(pending, at):
            # Its ttl ran out while it waited: it ends here, never runs.
            expired.append((job_id, endings.expired()))
            continue
        # the same worker claiming its running job again: its first answer was lost (claims.claim)
        again = pending is not None and pending.status == JobStatus.RUNNING
        job = claims.claim(session, job_id, worker_id, at)
        if job is not None:
            taken.append((job, again))
    # The worker made busy, if it was idle; its claims refused if it has ended: a worker the
    # reconciler failed (and killed) whose last claim arrives late would hold a job it never
    # runs, until the reconciler took it back at the cost of an attempt
    # (`reconcile/jobs.requeue_orphans`).
    new_jobs = any(not again for _, again in taken)
    if new_jobs and not worker_records.follow_jobs(session, ctx.settings, worker_id, at):
        session.rollback()
        log.info("claims of ended worker %s refused", worker_id, extra={"worker_id": worker_id})
        return [None] * len(job_ids)
    if expired:
        finish.finish(session, ctx.outbox, expired, at)  # commits the claims with them
    else:
        session.commit()
    news = [job for job, again in taken if not again]  # (again: announced the first time)
    if news:
        pipe = ctx.redis.pipeline(transaction=False)  # every `running` event in a round trip
        for job in news:
            data = {"attempt": job.attempt, "worker_id": worker_id}
            events.publish_to(pipe, [job.id], EventType.RUNNING, data)
        pipe.execute()
    for job in news:
        claims.announce(ctx.celery, ctx.sessions, job, worker_id, at, session)
    answers = {
        job.id: claims.answer(job, ctx.specs.current(session, job.deployment_id)).to_dict()
        for job, _ in taken
    }
    return [answers.get(job_id) for job_id in job_ids]


@router.post("/jobs/complete")
async def complete_many(body: CompleteManyRequest, ctx: Ctx, at: Now) -> Any:
    ok = await run_in_threadpool(_in_session, _complete, ctx, body.reports, at)
    return {
        "reports": [{"job_id": r.job_id, "ok": o} for r, o in zip(body.reports, ok, strict=True)]
    }


@router.post("/jobs/{job_id}/complete")
async def complete(job_id: str, body: CompleteRequest, ctx: Ctx, at: Now) -> Any:
    report = JobReport(job_id=job_id, **body.model_dump(exclude={"worker_id"}))
    (ok,) = await run_in_threadpool(_in_session, _complete, ctx, [report], at)
    if not ok:
        raise Conflict(
            f"attempt {body.attempt} of job '{job_id}' is no longer current", job_id=job_id
        )
    return {"ok": True}


def _complete(
    ctx: AppContext, session: Session, reports: list[JobReport], at: datetime
) -> list[bool]:
    """End each reported job (one transaction); whether each report was current. A report
    that is not valid refuses them all, before anything is written."""
    ends: list[tuple[str, endings.Ending]] = []
    for r in reports:
        try:
            status = JobStatus(r.status)
        except ValueError:
            raise InvalidRequest(f"unknown status {r.status!r}") from None
        if status not in TERMINAL:
            raise InvalidRequest(f"{status} is not a terminal status")
        ending = endings.reported(
            status,
            r.attempt,
            output=r.output,
            error=_for_tenant(ctx, session, r.job_id, r.error),
            prompt_tokens=r.prompt_tokens,
            generated_tokens=r.generated_tokens,
        )
        ends.append((r.job_id, ending))
    with _report_spans(reports):
        # (their worker goes back to idle at the reconciler's next tick: workers.settle_idle)
        ended = {job.id for job in finish.finish(session, ctx.outbox, ends, at)}
    return [r.job_id in ended for r in reports]


def _for_tenant(
    ctx: AppContext, session: Session, job_id: str, error: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A reported error as its tenant reads it: the worker names what it read by its internal
    path; the tenant knows it as `store://` (domain/user_paths.py). Failures are rare: one
    lookup of the job's tenant each."""
    message = (error or {}).get("message")
    if not isinstance(message, str) or "s3://" not in message:
        return error
    tenant_id = session.scalar(select(Job.tenant_id).where(Job.id == job_id))
    if tenant_id is None:
        return error  # no such job: the fenced end refuses the report anyway
    shown = user_paths.for_tenant(message, ctx.settings.store_bucket, tenant_id)
    return {**(error or {}), "message": shown}


@contextlib.contextmanager
def _report_spans(reports: list[JobReport]) -> Iterator[None]:
    """In a request of several reports, one server span per traced report, under its worker's
    report span (a request of one has its own: trace_requests.py)."""
    spans = [
        tracing.start_span(
            f"POST {REPORTS_PATH}",
            parent=tracing.context_of(r.traceparent),
            kind="server",
            attributes={"http.route": REPORTS_PATH, tracing.JOB_ID: r.job_id},
        )
        for r in reports
        if r.traceparent and len(reports) > 1
    ]
    try:
        yield
    except BaseException as exc:
        for s in spans:
            if s is not None:
                tracing.failed(s, type(exc).__name__)
        raise
    finally:
        for s in spans:
            if s is not None:
                s.end()


@router.post("/workers/{worker_id}/state")
def worker_state(
    worker_id: str, body: WorkerStateReport, ctx: Ctx, session: Db, received: Now
) -> Any:
    try:
        state = WorkerState(body.state)
    except ValueError:
        raise InvalidRequest(f"unknown worker state {body.state!r}") from None
    at = datetime.fromtimestamp(body.at, UTC)
    w = worker_records.transition(
        session, ctx.settings, worker_id, state, at, received, body.reason
    )
    w.last_heartbeat_at = received
    if body.takes_handoffs:
        w.takes_handoffs = True
    session.commit()
    return {"ok": True, "state": w.state}

"""Worker records and their phase transitions; each closed phase becomes a billing record."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, bindparam, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.protocol import WorkerState
from control_plane.db import kept
from control_plane.db.models import BillingRecord, Deployment, Job, JobAttempt, Tenant, Worker
from control_plane.domain import user_paths
from control_plane.domain.billing_math import POOL_PHASE, phase_of
from control_plane.domain.clock import iso
from control_plane.domain.ids import new_id
from control_plane.domain.states import JobStatus
from control_plane.errors import NotFound
from control_plane.metrics import families, on_commit
from control_plane.services.tenants import api_keys
from control_plane.services.workers import billing
from control_plane.services.workers.boot_history import STARTUP_PHASES
from control_plane.settings import Settings

LIVE_STATES = frozenset(
    {
        WorkerState.BOOTING,
        WorkerState.LOADING,
        WorkerState.WARMING,
        WorkerState.IDLE,
        WorkerState.BUSY,
    }
)
ENDED_STATES = frozenset({WorkerState.STOPPED, WorkerState.FAILED})


# The tenant that pays for the warm pool (phase `pool`): the platform itself; it has no keys.
PLATFORM_TENANT_ID = "ten_platform"
POOL_REASON = "warm_pool"


def create(
    session: Session,
    deployment: Deployment | None,
    accelerator: str,
    reason: str,
    now: datetime,
    pool_engine: str = "builtin",
) -> Worker:
    """A booting worker's row: for `deployment` (on its engine), or (None) a warm-pool worker
    on `pool_engine`, which has no deployment yet and belongs to the platform's tenant."""
    if deployment is None:
        _platform_tenant(session, now)
    w = Worker(
        id=new_id("wrk", now),
        deployment_id=deployment.id if deployment else None,
        deployment_version=deployment.version if deployment else 0,
        tenant_id=deployment.tenant_id if deployment else PLATFORM_TENANT_ID,
        accelerator=accelerator,
        engine=deployment.engine_resolved if deployment else pool_engine,
        state=WorkerState.BOOTING,
        state_since=now,
        reason=reason,
        started_at=now,
    )
    session.add(w)
    return w


def _platform_tenant(session: Session, now: datetime) -> None:
    if session.get(Tenant, PLATFORM_TENANT_ID) is not None:
        return
    api_keys.create_tenant(session, "platform", now, tenant_id=PLATFORM_TENANT_ID)
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        pass  # created meanwhile by another process


def assign(
    session: Session, settings: Settings, w: Worker, dep: Deployment, reason: str, now: datetime
) -> bool:
    """Give an idle warm-pool worker to `dep`: its pool segment closes (the platform's), and it
    is `loading` for the deployment's tenant from `now`. False, changing nothing, when the
    worker is no longer an idle pool worker (assigned, stopping or dead meanwhile): a pool
    worker is never assigned twice; nor when it runs another engine than `dep`'s (it prepared
    only its own: the plans never choose one, and this holds whatever chose it)."""
    since = w.state_since
    try:
        with session.begin_nested():
            if now > since:
                billing.close_segment(session, settings, w, POOL_PHASE, since, now)
            result = session.execute(
                update(Worker)
                .where(
                    Worker.id == w.id,
                    Worker.deployment_id.is_(None),
                    Worker.state == WorkerState.IDLE,
                    Worker.state_since == since,
                    Worker.engine == dep.engine_resolved,
                )
                .values(
                    deployment_id=dep.id,
                    deployment_version=dep.version,
                    tenant_id=dep.tenant_id,
                    state=WorkerState.LOADING,
                    state_since=now,
                    started_at=now,
                    assigned_at=now,
                    reason=reason,
                )
                .execution_options(synchronize_session=False)
            )
            if cast(CursorResult[Any], result).rowcount != 1:
                raise _Taken
    except _Taken:
        return False
    kept.drop(session, _LIVE_KEY)  # a bulk update: no flush tells `live`
    session.refresh(w)
    return True


class _Taken(Exception):
    """The pool worker changed under an assignment (rolls the assignment back)."""


def idle_pooled(session: Session) -> list[Worker]:
    """Warm-pool workers waiting for an assignment (idle, no deployment yet)."""
    q = select(Worker).where(Worker.deployment_id.is_(None), Worker.state == WorkerState.IDLE)
    return list(session.scalars(q))


def pooled(session: Session) -> list[Worker]:
    """Live warm-pool workers (no deployment yet), oldest first."""
    q = select(Worker).where(Worker.deployment_id.is_(None), Worker.state.in_(_LIVE_VALUES))
    return list(session.scalars(q.order_by(Worker.started_at)))


def transition(
    session: Session,
    settings: Settings,
    worker_id: str,
    state: WorkerState,
    at: datetime,
    now: datetime,
    reason: str | None = None,
    note: str | None = None,
    *,
    locked: bool = False,
) -> Worker:
    """Move a worker to `state` at time `at`, closing the previous phase as a billing record.
    `locked`: the caller already holds the worker row's lock (`_locked`), as a claim and the
    reconciler's settling do; its state is read again all the same.

    Idempotent: a repeated or out-of-date report changes nothing; an ended worker stays ended.
    """
    w = _read(session, worker_id) if locked else _locked(session, worker_id)
    if w is None:
        raise NotFound(f"worker '{worker_id}' does not exist")
    if w.state in ENDED_STATES or w.state == state:
        return w
    if at < w.state_since:
        # A stale report (a retried POST overtaken by a newer one): the newer state stands.
        return w
    # Never in the future: clocks of two processes differ a little.
    at = min(at, now)
    phase = phase_of(w.state, pooled=w.deployment_id is None)
    if phase is not None and at > w.state_since:
        billing.close_segment(session, settings, w, phase, w.state_since, at, note=note)
    if phase in STARTUP_PHASES and state in _MOVED_ON:
        _count_startup_phase(session, w, phase, at)
    w.state = state
    w.state_since = at
    if reason:
        # as its tenant reads it: whole (bounded), naming its store:// paths, not the internals
        w.reason = user_paths.for_tenant(reason, settings.store_bucket, w.tenant_id)
    if state in ENDED_STATES:
        w.stopped_at = at
    if state == WorkerState.FAILED:
        failed = functools.partial(families.worker_failed, w.accelerator, reason)
        on_commit.after_commit(session, failed)
    return w


def _locked(session: Session, worker_id: str) -> Worker | None:
    """The worker as it is under its row's lock (PostgreSQL: the row; SQLite: the one write
    lock), held to the end of the transaction. Read without it, two transitions of one worker
    (the reconciler settling it idle, its own report that it drains) both saw the same phase:
    the later one's segment clashed with the earlier one's on (worker, start) and was dropped
    as a replay, and the time between the two went unbilled."""
    session.execute(
        update(Worker).where(Worker.id == worker_id).values(state=Worker.state),
        execution_options={"synchronize_session": False},
    )
    return _read(session, worker_id)


def _read(session: Session, worker_id: str) -> Worker | None:
    """The worker as the database has it now, not as this session last saw it."""
    return session.get(Worker, worker_id, populate_existing=True)


# A start-up phase completed when its worker went on to one of these (not failed or stopped).
_MOVED_ON = frozenset(
    {WorkerState.LOADING, WorkerState.WARMING, WorkerState.IDLE, WorkerState.BUSY}
)


def _count_startup_phase(session: Session, w: Worker, phase: str, at: datetime) -> None:
    """A deployment's worker completed start-up phase `phase` at `at`: its whole length (from
    the phase's first segment: a long one is rolled every minute) is observed once committed.
    A warm-pool worker's boot is not a cold start (its phase is `pool`, never counted)."""
    dep = session.get(Deployment, w.deployment_id) if w.deployment_id else None
    if dep is None:
        return
    began = session.scalar(
        select(func.min(BillingRecord.start)).where(
            BillingRecord.worker_id == w.id, BillingRecord.phase == phase
        )
    )
    seconds = (at - min(began or w.state_since, w.state_since)).total_seconds()
    observe = functools.partial(
        families.startup_phase, phase, w.accelerator, dep.name, dep.tenant_id, seconds
    )
    on_commit.after_commit(session, observe)


# Built once, on the table (a claim's path): see `follow_jobs`.
_workers = Worker.metadata.tables["workers"]
_STATE_FOR_CLAIM = (
    select(_workers.c.state).where(_workers.c.id == bindparam("worker_id")).with_for_update()
)


def follow_jobs(session: Session, settings: Settings, worker_id: str, at: datetime) -> bool:
    """A claim makes an idle worker busy, in the claim's own transaction (not committed here).
    False when the worker has ended (stopped, or failed by the reconciler, which killed it):
    the caller refuses its claim.

    Busy and idle follow the jobs a worker runs, decided here from the database (the worker
    reports neither: two requests fewer per job). Only this half is on a job's path: the other
    half, busy back to idle, is `settle_idle`'s, once per reconciler tick. So every job runs
    inside a busy segment (its cost is allocated from it), and a job's end writes nothing to its
    worker: back-to-back jobs toggle no state and close no billing segment each."""
    # Its state alone: most claims find it busy already, and then need no Worker object.
    # Locked (PostgreSQL; SQLite's claim already holds the one write lock): `settle_idle` must
    # not make it idle between this read and the claim's commit.
    state = session.scalar(_STATE_FOR_CLAIM, {"worker_id": worker_id})
    if state == WorkerState.IDLE:
        transition(session, settings, worker_id, WorkerState.BUSY, at, at, locked=True)
    return state not in ENDED_STATES


def settle_idle(session: Session, settings: Settings, now: datetime) -> list[str]:
    """Busy workers none of whose jobs runs any more become idle as of their last attempt's
    end (not committed); returns their ids.

    Exact but for one case: a job claimed before the tick noticed the previous one's end keeps
    the worker busy across the gap between them, so a gap shorter than a tick (250 ms) is billed
    as busy time, never as idle (the rate is the same; `usage` splits it among the jobs)."""
    busy = [w for w in live(session) if w.state == WorkerState.BUSY]
    idle = set(_without_running_jobs(session, [w.id for w in busy]))
    if not idle:
        return []
    # A claim may commit between that read and this transaction's: lock the candidates first
    # (PostgreSQL: their rows, which a claim locks too; SQLite: the one write lock) and read
    # again under the lock, so a worker that just got a job stays busy.
    session.execute(
        update(Worker)
        .where(Worker.id.in_(idle), Worker.state == WorkerState.BUSY)
        .values(state=Worker.state),
        execution_options={"synchronize_session": False},
    )
    idle = set(_without_running_jobs(session, list(idle)))
    settled = []
    for w in busy:
        if w.id not in idle:
            continue
        session.refresh(w)  # as it is now (its own report may have moved it on: draining)
        if w.state != WorkerState.BUSY:
            continue
        # by the (worker_id, started_at) index: only the attempts of this busy period
        last_end = session.scalar(
            select(func.max(JobAttempt.ended_at)).where(
                JobAttempt.worker_id == w.id, JobAttempt.started_at >= w.state_since
            )
        )
        at = min(max(last_end or now, w.state_since), now)
        transition(session, settings, w.id, WorkerState.IDLE, at, now, locked=True)
        settled.append(w.id)
    return settled


def _without_running_jobs(session: Session, worker_ids: list[str]) -> list[str]:
    """Those of these workers that hold no running job (by the running jobs' index)."""
    if not worker_ids:
        return []
    running = set(
        session.scalars(
            select(Job.worker_id)
            .where(Job.status == JobStatus.RUNNING, Job.worker_id.in_(worker_ids))
            .distinct()
        )
    )
    return [w for w in worker_ids if w not in running]


def live(session: Session, deployment_id: str | None = None) -> list[Worker]:
    """Live and draining workers (of one deployment, or all).

    All of them are read once per session and kept until a worker row is written through it
    (`db.kept`): a reconciler tick asks this of every reconciler, and at thousands of workers
    each read cost ~25 ms. Rows other processes insert meanwhile appear in the next session
    (the reconciler is the one that creates workers)."""
    if deployment_id:
        q = select(Worker).where(Worker.deployment_id == deployment_id)
        return list(session.scalars(q.where(Worker.state.in_(_LIVE_VALUES))))
    query = select(Worker).where(Worker.state.in_(_LIVE_VALUES))
    return kept.rows(session, _LIVE_KEY, Worker, lambda: list(session.scalars(query)))


_LIVE_KEY = "services.workers.worker_records.live"
_LIVE_VALUES = [s.value for s in LIVE_STATES | {WorkerState.DRAINING}]


def list_for_tenant(
    session: Session, tenant_id: str, deployment_id: str | None, limit: int = 100
) -> list[Worker]:
    q = select(Worker).where(Worker.tenant_id == tenant_id)
    if deployment_id:
        q = q.where(Worker.deployment_id == deployment_id)
    return list(session.scalars(q.order_by(Worker.started_at.desc()).limit(limit)))


def to_public(w: Worker, deployment_name: str) -> dict[str, Any]:
    return {
        "id": w.id,
        "deployment": deployment_name,
        "deployment_version": w.deployment_version,
        "state": w.state,
        "reason": w.reason,
        "accelerator": w.accelerator,
        "engine": w.engine,
        "started_at": iso(w.started_at),
        "stopped_at": iso(w.stopped_at),
    }

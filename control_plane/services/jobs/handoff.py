"""A job handed to a worker at admission: claimed for it in the admission's own transaction,
then sent to it through Redis, so the worker starts it without a claim request.

The warm path of a call was three HTTP exchanges: the call, the worker's claim of its job, the
worker's report. The claim's (its wake-up, the request, its transaction, the answer back) was
1.4-1.7 ms of the platform's 4.6-5.5 ms per call in interleaved runs of this machine's bench
(docs/benchmarks.md, Control plane). When one of the deployment's workers has a free slot, the
admission can make the same claim itself (`claims.claim_queued`, the one path of pending →
running, and `worker_records.follow_jobs`), commit it with the job, and push the claim's answer to
that worker's own list (`worker_handoffs_key`), which the worker pops before its queue's
wake-ups.

Only when nothing of the deployment waits (a queued job keeps its place in line), and only to
a worker that said it takes hand-offs (the platform's, once serving), of the deployment's
current version, idle or busy, and not told to stop. The slot count is the database's
(running jobs against `target_concurrency`, the worker's prefetch): two admissions at once may
both see the last free slot; the worker then starts both (its engine queues what its batch does
not hold), as it would a claim.

The database stays the truth (DESIGN §5): the push is a wake-up that carries the claim's
answer. A push that never arrives (Redis failed, the API died after the commit) leaves a job
running on a worker that does not hold it: the worker's heartbeat lists the jobs it holds, and
the reconciler requeues one it has not listed for HANDOFF_GRACE_S (`reconcile/jobs.py::
requeue_unheld`); a worker that stops first has its running jobs requeued as any dead
worker's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, exists, func, literal_column, or_, select, text
from sqlalchemy.orm import Session

from common.protocol import PRIORITY_OF_KIND, WorkerState
from control_plane.db.models import Job, Worker
from control_plane.domain import fleet
from control_plane.domain.states import JobStatus
from control_plane.services.jobs import claims
from control_plane.services.tenants.edge_cache import DeploymentRef
from control_plane.services.workers import worker_records
from control_plane.settings import Settings

_workers = Worker.metadata.tables["workers"]
_jobs = Job.metadata.tables["jobs"]
# A worker's running jobs: `status = 'running'` as a literal, so that the partial index of
# running jobs (ix_jobs_running) serves the count.
_RUNNING = (
    select(func.count())
    .where(_jobs.c.worker_id == _workers.c.id, _jobs.c.status == literal_column("'running'"))
    .scalar_subquery()
)
# A job of the deployment that waits for a worker (queued and sent, or starting): then a new
# one takes its turn in the queue.
_WAITING = exists().where(
    _jobs.c.deployment_id == bindparam("b_dep"),
    text(f"jobs.status IN ('{JobStatus.QUEUED.value}', '{JobStatus.STARTING.value}')"),
    _jobs.c.dispatched_at.is_not(None),
)
_STOPPING = ", ".join(f"'{reason}'" for reason in fleet.STOP_REASONS)
# The least busy worker with a free slot. Built once, its lists literal: on every admission's
# path, where an expanding IN is compiled per call.
_PICK = (
    select(_workers.c.id)
    .where(
        _workers.c.deployment_id == bindparam("b_dep"),
        _workers.c.deployment_version == bindparam("b_version"),
        text(f"workers.state IN ('{WorkerState.IDLE.value}', '{WorkerState.BUSY.value}')"),
        _workers.c.takes_handoffs.is_(True),
        # told to stop (it drains): the reason the reconciler set before its SIGTERM
        or_(_workers.c.reason.is_(None), text(f"workers.reason NOT IN ({_STOPPING})")),
        bindparam("b_slots") > _RUNNING,
        ~_WAITING,
    )
    .order_by(_RUNNING, _workers.c.id)
    .limit(1)
)


@dataclass(frozen=True, slots=True)
class HandOff:
    """A job claimed for a worker at admission, to send once committed (`dispatch.wake`)."""

    job: Job  # as claimed: running, its new attempt
    worker_id: str
    message: bytes  # what the worker pops (`message`)


def pick(session: Session, settings: Settings, dep: DeploymentRef) -> str | None:
    """The worker of `dep` to hand a new job to, if one has a free slot and nothing of `dep`
    waits; None: the job waits for a worker's claim. A read, before the admission's INSERT:
    outside SQLite's write lock, which every admission takes in turn (read under it, it cost a
    burst a few percent of its admissions in `bench/ab_warm_path.py --admissions`)."""
    if not settings.job_handoffs:
        return None
    params = {"b_dep": dep.id, "b_version": dep.version, "b_slots": dep.spec.target_concurrency}
    worker_id: str | None = session.execute(_PICK, params).scalar()
    return worker_id


def give(
    session: Session,
    settings: Settings,
    dep: DeploymentRef,
    job: Job,
    worker_id: str,
    now: datetime,
) -> HandOff | None:
    """Claim the just-inserted `job` for `worker_id` (`pick`), in the caller's transaction
    (not committed); None when the claim is refused (it waits for a worker's claim)."""
    # a job with a ttl takes the general claim (which would judge the ttl; it has not run out)
    taken = claims.claim_queued(session, job.id, worker_id, now) or claims.claim(
        session, job.id, worker_id, now
    )
    if taken is None:
        return None
    # busy, if it was idle (`pick` read it live in this transaction; one failed since has the
    # job taken back by the reconciler, `reconcile/jobs.requeue_orphans`)
    worker_records.follow_jobs(session, settings, worker_id, now)
    return HandOff(taken, worker_id, message(taken, dep))


def message(job: Job, dep: DeploymentRef) -> bytes:
    """What the worker pops: the claim's answer, with the job's broker priority."""
    priority = PRIORITY_OF_KIND.get(job.kind, PRIORITY_OF_KIND["async"])
    return claims.answer(job, dep.spec, priority).to_json().encode()

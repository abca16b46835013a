"""A batch's slots: which of its lines may run, and a slot handed on the moment a line ends.

A batch runs at most `max_in_flight` of its lines at once (batches.py): a line holds a slot
from its `dispatched_at` to its end. The loop's pump tops every running batch up on its tick;
a line that ended between two ticks used to leave its slot empty until the next one, so a
batch of short lines ran at `max_in_flight` lines per tick, whatever its workers could do (4
lines per 0.5 s at the defaults: 8 lines/s). Now the transaction that ends a line also gives
its slot to the batch's next waiting line (`hand_over`, called by `finish.finish`), and that
line is woken once it is committed (`wake`). The pump stays: it fills what a handover could
not (a line ended while another transaction held the next one) and completes batches.

A batch is completed by the pump (it writes the results file to object storage: no work for a
worker's report to wait on). The transaction that ends a batch's last active line sees it
drained, and `wake` then nudges the loop to tick at once, instead of the batch waiting up to a
tick for its completion.

    handover = hand_over(session, ended_jobs, now)   # before the commit that ends them
    session.commit()
    wake(r, handover, now)                            # best effort, as every wake-up
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import redis
from sqlalchemy import bindparam, select, text, update
from sqlalchemy.orm import Session

from control_plane.db.models import Job
from control_plane.domain.states import ACTIVE, PENDING
from control_plane.services.jobs.dispatch import wake as wake_job
from control_plane.services.jobs.job_queries import states_sql
from control_plane.services.scaling import arrivals

log = logging.getLogger(__name__)
_jobs = Job.metadata.tables["jobs"]
# Built once (Core, on the table), as the other statements of a job's end (finish.py).
# SKIP LOCKED: two transactions handing slots of one batch over at once (two API processes
# ending two of its lines) take different lines instead of the second waiting for the first
# and then finding its line taken. SQLite has one writer at a time and renders no FOR UPDATE.
_NEXT_WAITING = (
    select(_jobs.c.id)
    .where(
        _jobs.c.batch_id == bindparam("batch_id"),
        _jobs.c.dispatched_at.is_(None),
        text(f"status IN ({states_sql(PENDING)})"),
    )
    .order_by(_jobs.c.batch_index)
    .limit(bindparam("n"))
    .with_for_update(skip_locked=True)
)
_DISPATCH = (
    update(_jobs)
    .where(_jobs.c.id.in_(bindparam("ids", expanding=True)), _jobs.c.dispatched_at.is_(None))
    .values(dispatched_at=bindparam("now"))
    .returning(_jobs.c.id)
)
_ANY_ACTIVE = (
    select(_jobs.c.id)
    .where(
        _jobs.c.batch_id == bindparam("batch_id"),
        text(f"status IN ({states_sql(ACTIVE)})"),
    )
    .limit(1)
)


@dataclass(slots=True)
class Handover:
    """What the end of some batch lines changed, for `wake` once it is committed."""

    # deployment id -> lines that just got a slot
    woken: dict[str, list[str]] = field(default_factory=dict)
    # batches with no line left to run or to wait: the pump completes them
    drained: list[str] = field(default_factory=list)


def dispatch_next(session: Session, batch_id: str, n: int, now: datetime) -> list[str]:
    """Give the next `n` waiting lines of a batch, in input order, their slots (`dispatched_at`
    set, not committed); their ids, fewer when fewer wait (or another transaction took them)."""
    if n <= 0:
        return []
    ids = list(session.scalars(_NEXT_WAITING, {"batch_id": batch_id, "n": n}))
    if not ids:
        return []
    return list(session.scalars(_DISPATCH, {"ids": ids, "now": now}))


def hand_over(session: Session, ended: Iterable[Job], now: datetime) -> Handover:
    """The slots of the batch lines that just ended (written, not committed), each given to
    its batch's next waiting line in the same transaction; and the batches this left drained.

    A line held a slot if it was dispatched; one that ended while it waited (canceled, its ttl
    passed) held none, and hands nothing on."""
    freed: Counter[tuple[str, str]] = Counter(
        (job.batch_id, job.deployment_id)
        for job in ended
        if job.batch_id is not None and job.dispatched_at is not None
    )
    out = Handover()
    for (batch_id, deployment_id), n in freed.items():
        ids = dispatch_next(session, batch_id, n, now)
        if ids:
            out.woken.setdefault(deployment_id, []).extend(ids)
        elif session.scalar(_ANY_ACTIVE, {"batch_id": batch_id}) is None:
            out.drained.append(batch_id)  # its last lines: nothing waits, nothing runs
    return out


def wake(r: redis.Redis, handover: Handover, now: datetime) -> None:
    """After the commit: each deployment's newly dispatched lines; a tick of the loop now
    when a batch was drained (its completion is the pump's)."""
    for deployment_id, job_ids in handover.woken.items():
        wake_dispatched(r, deployment_id, job_ids, now)
    if handover.drained:
        try:
            arrivals.nudge_reconciler(r)
        except redis.RedisError as exc:  # the next tick completes it anyway
            log.warning("could not nudge the loop for drained batches (Redis: %s)", exc)


def wake_dispatched(r: redis.Redis, deployment_id: str, job_ids: list[str], now: datetime) -> None:
    """Batch lines just given a slot (committed): they arrive at the deployment now (the
    autoscaler's arrival history counts a batch line when it is dispatched, not when the batch
    was created: `max_in_flight` bounds the work it adds), and each gets its wake-up. Best
    effort: a lost wake-up is re-sent by the loop's redispatch."""
    arrivals.record(r, deployment_id, now, len(job_ids))
    for job_id in job_ids:
        wake_job(r, deployment_id, job_id, "batch")

"""Gathering (I/O): `check()` waits, within its bounds, for what must happen eventually (terminal
states, billing allocations, webhooks, acks), reads the SQL ledger and Redis into a `Snapshot`,
and hands it to the judges.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import cast

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from common.protocol import KEY_PREFIX
from control_plane.db.models import BillingRecord, CostAllocation, Job, JobAttempt, Worker
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.workers import billing
from tests.faults.invariants.evidence import (
    TERMINAL_STATUSES,
    UNACKED_INDEX_KEY,
    UNACKED_KEY,
    Bounds,
    Evidence,
    Snapshot,
    Unacked,
    Violation,
)
from tests.faults.invariants.judges import (
    _accepted_completions,
    _idle_s,
    judge_broker,
    judge_results,
    judge_terminal,
    judge_tiling,
    judge_webhooks,
)


def check(evidence: Evidence, bounds: Bounds | None = None) -> list[Violation]:
    """Wait (within `bounds`) for what must happen eventually, then judge every invariant."""
    bounds = bounds or Bounds()
    engine = make_engine(evidence.database_url)
    sessions = make_sessionmaker(engine)
    r = redis.Redis.from_url(evidence.redis_url, socket_timeout=10)
    try:
        deadline = time.monotonic() + bounds.terminal_s
        while True:
            with sessions() as session:
                jobs = _jobs(session, evidence.admitted)
            done = all(s in TERMINAL_STATUSES for s, _, _ in jobs.values())
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        deadline = time.monotonic() + bounds.settle_s
        while True:
            snap = _snapshot(sessions, r, evidence.admitted, bounds)
            if _settled(snap, evidence, bounds) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        log = evidence.webhooks.log() if evidence.webhooks else []
    finally:
        r.close()
        engine.dispose()
    out = judge_terminal(evidence.admitted, snap.jobs, bounds.terminal_s)
    out += judge_results(snap)
    if evidence.webhooks is not None:
        out += judge_webhooks(log, evidence.webhooks)
    out += judge_tiling(snap)
    out += [Violation("I5", "drift", f"billing.check: {issue}") for issue in snap.drift]
    out += judge_broker(snap, bounds.unacked_s)
    print(
        f"checker: {len(evidence.admitted)} admitted jobs, {len(snap.attempts)} attempts, "
        f"{len(snap.allocations)} allocations, {len(snap.workers)} workers, "
        f"{sum(map(len, snap.records.values()))} billing records, {len(log)} webhook attempts, "
        f"{len(snap.unacked)} unacked messages, {snap.streams_checked} streams: "
        f"{len(out)} violation(s)"
    )
    return out


def _chunks(ids: Sequence[str], size: int = 500) -> Iterable[Sequence[str]]:
    for i in range(0, len(ids), size):
        yield ids[i : i + size]


def _ts(t: datetime | None) -> float | None:
    return None if t is None else t.timestamp()


def _jobs(session: Session, ids: Sequence[str]) -> dict[str, tuple[str, int, float | None]]:
    out: dict[str, tuple[str, int, float | None]] = {}
    for chunk in _chunks(ids):
        rows = session.execute(
            select(Job.id, Job.status, Job.attempt, Job.completed_at).where(Job.id.in_(chunk))
        )
        for job_id, status, attempt, completed_at in rows:
            out[job_id] = (status, attempt, _ts(completed_at))
    return out


def _snapshot(
    sessions: Callable[[], Session], r: redis.Redis, admitted: Sequence[str], bounds: Bounds
) -> Snapshot:
    with sessions() as session:
        snap = Snapshot(now=time.time(), jobs=_jobs(session, admitted))
        for chunk in _chunks(admitted):
            snap.attempts += [
                (a.job_id, a.attempt, a.outcome, a.ended_at is not None)
                for a in session.scalars(select(JobAttempt).where(JobAttempt.job_id.in_(chunk)))
            ]
            snap.allocations += [
                (c.billing_record_id, c.job_id, c.attempt, c.billable)
                for c in session.scalars(
                    select(CostAllocation).where(CostAllocation.job_id.in_(chunk))
                )
            ]
        for w in session.scalars(select(Worker)):
            # A warm-pool worker's life begins with its pool records (the platform's), before
            # its assignment (its started_at for the tenant): its first record starts then.
            born = w.started_at if w.assigned_at is None else None
            snap.workers[w.id] = (_ts(born), _ts(w.stopped_at))
        for rec in session.scalars(select(BillingRecord).order_by(BillingRecord.start)):
            snap.records.setdefault(rec.worker_id, []).append(
                (rec.id, rec.start.timestamp(), rec.end.timestamp())
            )
        snap.drift = billing.check(session, None, datetime.now(UTC))
        snap.unacked = _unacked(r)
        others = [u.job_id for u in snap.unacked if u.job_id and u.job_id not in snap.jobs]
        snap.others = _jobs(session, others)
    snap.stream_pending, snap.streams_checked = _stream_pending(r, bounds.unacked_s)
    return snap


def _unacked(r: redis.Redis) -> list[Unacked]:
    scored = cast(list[tuple[bytes, float]], r.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True))
    index = {_text(tag): float(score) for tag, score in scored}
    out = []
    for tag, raw in cast(dict[bytes, bytes], r.hgetall(UNACKED_KEY)).items():
        task, job_id, eta = _describe(raw)
        out.append(Unacked(_text(tag), index.get(_text(tag), 0.0), task, job_id, eta))
    return out


def _describe(raw: bytes) -> tuple[str | None, str | None, float | None]:
    """(task, job id, eta) of a kombu unacked entry: `[payload, exchange, routing_key]`."""
    try:
        payload = json.loads(raw)[0]
        headers = payload.get("headers") or {}
        body = payload.get("body")
        if (payload.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        decoded = json.loads(body) if isinstance(body, str | bytes) else body
        kwargs = decoded[1] if isinstance(decoded, list) and len(decoded) >= 2 else {}
        eta = headers.get("eta")
        eta_s = datetime.fromisoformat(eta).timestamp() if isinstance(eta, str) else None
        return headers.get("task"), kwargs.get("job_id"), eta_s
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None, None, None


def _stream_pending(r: redis.Redis, bound_s: float) -> tuple[list[tuple[str, str, int]], int]:
    """Entries pending in a consumer group longer than `bound_s`, over every stream of ours."""
    streams = [_text(k) for k in r.scan_iter(match=f"{KEY_PREFIX}:*", count=1000, _type="stream")]
    pipe = r.pipeline(transaction=False)
    for key in streams:
        pipe.xinfo_groups(key)
    out = []
    for key, groups in zip(streams, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(groups, Exception):
            continue  # the stream expired between SCAN and XINFO
        for g in groups:
            name = _text(g["name"])
            old = r.xpending_range(key, name, "-", "+", 10_000, idle=int(bound_s * 1000))
            if old:
                out.append((key, name, len(old)))
    return out, len(streams)


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _settled(snap: Snapshot, evidence: Evidence, bounds: Bounds) -> bool:
    """Everything that must happen eventually happened, or has run out its own bound."""
    if any(s not in TERMINAL_STATUSES for s, _, _ in snap.jobs.values()):
        return True  # I1 already failed: nothing more will settle
    billed = {job for _, job, _, billable in snap.allocations if billable}
    if any(s == "succeeded" and j not in billed for j, (s, _, _) in snap.jobs.items()):
        return False
    if any(not ended for *_, ended in snap.attempts):
        return False
    webhooks = evidence.webhooks
    if webhooks is not None and not webhooks.job_ids <= _accepted_completions(webhooks.log()):
        return False
    # an unneeded unacked message is judged once its bound has passed (it may yet be acked)
    return all(
        age <= 0 or age >= bounds.unacked_s for age in (_idle_s(u, snap) for u in snap.unacked)
    )

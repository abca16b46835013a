"""The one checker of the fault suite: what must hold after any fault, read from the platform's
own stores (SQL ledger, Redis) and from a webhook receiver's log. DESIGN §5 in executable form.

    I1  every admitted job (the client got 201/202) reaches a terminal state within a bound
    I2  at most one accepted result per job; each job billed once, for its final attempt;
        no attempt of an ended job left open; every succeeded job billed
    I3  one distinct `webhook-id` per (job, event); every attempt validly signed (the
        `standardwebhooks` package, the tenant's secret)
    I4  the billing records of each worker tile its life: no overlap, gap or duplicate
    I5  `services.workers.billing.check` reports nothing
    I6  no broker message (kombu's `unacked` hash / `unacked_index` zset) unacked longer than
        a bound after nothing needs it; no stream entry pending in a consumer group longer
        (the platform uses no groups today; XINFO GROUPS on every stream would show one)

`check()` gathers (I/O), then the `judge_*` functions decide (pure, over plain rows). Things
that must hold *eventually* (billing allocations, webhooks, acks) are polled until they hold
or the bounds pass, so a violation means "did not happen within the bound", never "not yet".

NOTE: the checker never prints prompts, outputs or webhook bodies: ids, counts and ages only.
"""

from __future__ import annotations

import base64
import hmac
import itertools
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

from common.protocol import KEY_PREFIX, RUN_JOB_TASK
from control_plane.db.models import BillingRecord, CostAllocation, Job, JobAttempt, Worker
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.states import TERMINAL
from control_plane.reconcile.driver import WAKEUP_SWEEP_EVERY
from control_plane.reconcile.jobs import WAKEUP_GRACE_S
from control_plane.services.workers import billing
from tests.faults.receiver import Delivery

# kombu's Redis transport keeps delivered, unacknowledged messages here (its default names).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
# Attempt outcomes that are the platform's fault: never an accepted result, never billed.
PLATFORM_FAULTS = frozenset({"worker_lost"})
# Webhook events that happen once per job (so: one message id per job).
ONCE_PER_JOB_EVENTS = frozenset({"job.completed"})
# How far a webhook's timestamp may be from its arrival (the Standard Webhooks tolerance).
WEBHOOK_TOLERANCE_S = 300.0
# A stopped worker's records must cover its life to this (docs/billing.md: within one second).
LIFETIME_TOLERANCE_S = 1.0
# At most this many lines per invariant in a report; the count says how many there were.
MAX_LINES = 20
TERMINAL_STATUSES = frozenset(s.value for s in TERMINAL)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant, in words (ids, counts and ages only)."""

    invariant: str  # "I1" … "I6"
    kind: str  # what broke, for counting: lost, duplicate_result, duplicate_billing, gap, ...
    detail: str  # what was seen, with the ids to look up

    def __str__(self) -> str:
        return f"{self.invariant} {self.kind}: {self.detail}"


# I6's bound is the platform's own: the reconciler forgets an unacked wake-up once its delivery
# is WAKEUP_GRACE_S old, in a sweep run at most every WAKEUP_SWEEP_EVERY, on a tick (every
# autoscaler_interval_s, at most 2 s, plus the tick's own length). A message left by a worker
# killed between its report and its ack can so stay WAKEUP_GRACE_S + WAKEUP_SWEEP_EVERY + a
# tick after it was delivered; 15 s, the two alone, was missed by 0.3 s once (a worker
# SIGKILLed 0.1 s after its job's end, network faults scenario).
UNACKED_BOUND_S = WAKEUP_GRACE_S + WAKEUP_SWEEP_EVERY.total_seconds() + 5.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """How long the checker waits before a "not yet" becomes a violation."""

    terminal_s: float = 300.0  # I1: admitted jobs are terminal within this (from check())
    settle_s: float = 60.0  # I2/I3/I6: billing, webhooks and acks settle within this, after I1
    unacked_s: float = UNACKED_BOUND_S  # I6: a message needed by nothing may stay unacked


@dataclass(frozen=True, slots=True)
class WebhookEvidence:
    """What a scenario that used webhooks hands the checker."""

    log: Callable[[], list[Delivery]]  # the receiver's log, read again while settling
    secret: str  # the tenant's `whsec_` signing secret
    job_ids: frozenset[str]  # admitted jobs submitted with the receiver's URL


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a scenario knows after its faults: where the stores are and what it was promised."""

    database_url: str  # platform.json → database_url
    redis_url: str  # platform.json → redis_url
    admitted: Sequence[str]  # job ids the client got 201/202 for
    webhooks: WebhookEvidence | None = None  # None: the scenario used no webhooks


@dataclass(frozen=True, slots=True)
class Unacked:
    """One delivered, unacknowledged broker message (kombu's `unacked` entry)."""

    tag: str  # kombu delivery tag
    delivered_at: float  # time.time() when it was delivered (its `unacked_index` score)
    task: str | None  # Celery task name from the message headers
    job_id: str | None  # the job it wakes or concerns (kwargs.job_id), if any
    eta: float | None  # a Celery countdown (retry) held by the worker until then


@dataclass(slots=True)
class Snapshot:
    """Rows read at one moment; the judges need nothing else."""

    now: float  # time.time() of the read
    # admitted job id → (status, attempt, completed_at)
    jobs: dict[str, tuple[str, int, float | None]]
    # the same, for other jobs that unacked messages point at (warm-up calls, say)
    others: dict[str, tuple[str, int, float | None]] = field(default_factory=dict)
    # (job id, attempt, outcome, ended)
    attempts: list[tuple[str, int, str | None, bool]] = field(default_factory=list)
    # (billing record id, job id, attempt, billable)
    allocations: list[tuple[int, str, int, bool]] = field(default_factory=list)
    # worker id → (started_at or None for a warm-pool worker, stopped_at or None)
    workers: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # worker id → [(record id, start, end)] sorted by start
    records: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)
    drift: list[dict[str, Any]] = field(default_factory=list)  # billing.check's issues
    unacked: list[Unacked] = field(default_factory=list)
    # (stream, group, entries pending longer than the bound)
    stream_pending: list[tuple[str, str, int]] = field(default_factory=list)
    streams_checked: int = 0  # how many streams XINFO GROUPS looked at


def assert_holds(violations: Iterable[Violation], invariant: str | None = None) -> None:
    """Fail with the violations (of `invariant`, or all) listed; print them in any case."""
    found = [v for v in violations if invariant is None or v.invariant == invariant]
    lines = [str(v) for v in found[:MAX_LINES]]
    if len(found) > MAX_LINES:
        lines.append(f"... and {len(found) - MAX_LINES} more")
    for line in lines:
        print(line)
    assert not found, f"{len(found)} violation(s):\n" + "\n".join(lines)


# --- gathering (I/O) ----------------------------------------------------------------------


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


# --- judging (pure) -----------------------------------------------------------------------


def judge_terminal(
    admitted: Sequence[str], jobs: dict[str, tuple[str, int, float | None]], bound_s: float
) -> list[Violation]:
    """I1: every admitted job exists and is terminal."""
    out = []
    for job_id in admitted:
        if job_id not in jobs:
            out.append(Violation("I1", "lost", f"job {job_id} was acknowledged but has no row"))
        elif (status := jobs[job_id][0]) not in TERMINAL_STATUSES:
            out.append(Violation("I1", "lost", f"job {job_id} still {status} after {bound_s:g} s"))
    return out


def judge_results(snap: Snapshot) -> list[Violation]:
    """I2: one accepted result and one billed attempt per job, the final one; none left open."""
    out = []

    def bad(kind: str, detail: str) -> None:
        out.append(Violation("I2", kind, detail))

    results: Counter[str] = Counter()
    for job_id, attempt, outcome, ended in snap.attempts:
        status = snap.jobs.get(job_id, ("?", 0, None))[0]
        if outcome is not None and outcome not in PLATFORM_FAULTS:
            results[job_id] += 1
        if not ended and status in TERMINAL_STATUSES:
            bad("open_attempt", f"job {job_id} is {status} but its attempt {attempt} never ended")
    for job_id, n in results.items():
        if n > 1:
            bad("duplicate_result", f"job {job_id} has {n} accepted results")
    succeeded = {(j, a) for j, a, outcome, _ in snap.attempts if outcome == "succeeded"}
    for job_id, (status, attempt, _) in snap.jobs.items():
        if status == "succeeded" and (job_id, attempt) not in succeeded:
            bad("wrong_result", f"job {job_id} succeeded but its final attempt {attempt} did not")
    seen = Counter((rec, job, attempt) for rec, job, attempt, _ in snap.allocations)
    for (rec, job, attempt), n in seen.items():
        if n > 1:
            bad("duplicate_billing", f"job {job} attempt {attempt}: {n} allocations of {rec}")
    billed: dict[str, set[int]] = defaultdict(set)
    for _, job, attempt, billable in snap.allocations:
        if billable:
            billed[job].add(attempt)
    outcome_of = {(j, a): o for j, a, o, _ in snap.attempts}
    for job_id, (status, attempt, _) in snap.jobs.items():
        attempts = billed.get(job_id, set())
        if len(attempts) > 1:
            bad("duplicate_billing", f"job {job_id} billed for attempts {sorted(attempts)}")
        for a in attempts:
            if outcome_of.get((job_id, a)) in PLATFORM_FAULTS:
                bad("billed_lost_attempt", f"job {job_id} billed for attempt {a}, lost")
            elif a != attempt:
                bad("billed_wrong_attempt", f"job {job_id} billed for {a}, not its final {attempt}")
        if status == "succeeded" and not attempts:
            bad("unbilled", f"job {job_id} succeeded but was never billed")
    return out


def _event_of(d: Delivery) -> tuple[str | None, str | None]:
    """(job id, event type) of a delivery, from its body; (None, None) if unreadable."""
    try:
        event = json.loads(d.body)
        return str(event["data"]["id"]), str(event["type"])
    except (ValueError, TypeError, KeyError):
        return None, None


def judge_webhooks(log: Sequence[Delivery], evidence: WebhookEvidence) -> list[Violation]:
    """I3: one message id per (job, once-per-job event); every attempt validly signed."""
    out = []
    wh = Webhook(evidence.secret)
    ids: dict[tuple[str, str], set[str]] = defaultdict(set)
    for n, d in enumerate(log):
        job_id, event = _event_of(d)
        msg_id = d.headers.get("webhook-id", "")
        if job_id is None or event is None:
            detail = f"delivery #{n} (webhook-id {msg_id!r}) has no readable job and type"
            out.append(Violation("I3", "unreadable", detail))
            continue
        ids[(job_id, event)].add(msg_id)
        problem = _signature_problem(wh, d)
        if problem:
            detail = f"delivery #{n} of {event} for job {job_id}: {problem}"
            out.append(Violation("I3", "bad_signature", detail))
    for (job_id, event), msg_ids in ids.items():
        if event in ONCE_PER_JOB_EVENTS and len(msg_ids) != 1:
            detail = f"job {job_id} {event}: {len(msg_ids)} distinct webhook-ids"
            out.append(Violation("I3", "duplicate_webhook_id", detail))
    accepted = _accepted_completions(log)
    for job_id in sorted(evidence.job_ids):
        if job_id not in accepted:
            detail = f"job {job_id} asked for a webhook; job.completed never arrived"
            if ids.get((job_id, "job.completed")):
                detail += " with an answer the sender took (only refused attempts)"
            out.append(Violation("I3", "missing_webhook", detail))
    return out


def _accepted_completions(log: Sequence[Delivery]) -> set[str | None]:
    """Jobs whose `job.completed` reached the receiver in an attempt it answered 2xx (one it
    refused, reset or answered too late does not count: the sender will try again)."""
    return {
        _event_of(d)[0] for d in log if 200 <= d.status < 300 and _event_of(d)[1] == "job.completed"
    }


def _signature_problem(wh: Webhook, d: Delivery) -> str | None:
    """Why this attempt's Standard Webhooks headers do not verify (None: they do).

    Verified against its arrival time, not the checker's clock: `Webhook.verify` would call a
    long run's first deliveries "too old" by the time the checker reads them.
    """
    msg_id, stamp = d.headers.get("webhook-id"), d.headers.get("webhook-timestamp")
    signatures = d.headers.get("webhook-signature")
    if not (msg_id and stamp and signatures):
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    try:
        sent = datetime.fromtimestamp(int(stamp), UTC)
    except ValueError:
        return f"bad webhook-timestamp {stamp!r}"
    if abs(sent.timestamp() - d.received_at) > WEBHOOK_TOLERANCE_S:
        return f"timestamp {stamp} is {d.received_at - sent.timestamp():.0f} s from arrival"
    expected = wh.sign(msg_id, sent, d.body.decode()).encode()
    offered = [s.encode() for s in signatures.split(" ")]
    if not any(hmac.compare_digest(expected, s) for s in offered):
        return "no signature matches the tenant's secret"
    return None


def judge_tiling(snap: Snapshot) -> list[Violation]:
    """I4: each worker's records tile its life: no duplicate, overlap or gap; ended workers
    covered from start to stop (to LIFETIME_TOLERANCE_S)."""
    out = []

    def bad(kind: str, worker_id: str, detail: str) -> None:
        out.append(Violation("I4", kind, f"worker {worker_id}: {detail}"))

    for worker_id, recs in snap.records.items():
        for start, n in Counter(start for _, start, _ in recs).items():
            if n > 1:
                bad("duplicate_record", worker_id, f"{n} records start at {start:.3f}")
        for rec_id, start, end in recs:
            if end < start:
                bad("negative_record", worker_id, f"record {rec_id} ends before it starts")
        for (a_id, _, a_end), (b_id, b_start, _) in itertools.pairwise(recs):
            if b_start < a_end:
                bad("overlap", worker_id, f"records {a_id}, {b_id} overlap {a_end - b_start:.3f} s")
            elif b_start > a_end:
                bad("gap", worker_id, f"{b_start - a_end:.3f} s between records {a_id}, {b_id}")
        started, stopped = snap.workers.get(worker_id, (None, None))
        if started is not None and recs and abs(recs[0][1] - started) > LIFETIME_TOLERANCE_S:
            bad("uncovered", worker_id, f"first record starts {recs[0][1] - started:.3f} s late")
        if stopped is not None and recs and abs(recs[-1][2] - stopped) > LIFETIME_TOLERANCE_S:
            gap = stopped - recs[-1][2]
            bad("uncovered", worker_id, f"last record ends {gap:.3f} s before it stopped")
    return out


def _idle_s(u: Unacked, snap: Snapshot) -> float:
    """How long an unacked message has been needed by nothing (0: it is still needed).

    A job's wake-up is needed while its job runs (the worker acks after storing the outcome);
    a Celery countdown is needed until its eta; anything else only while being handled.
    """
    if u.eta is not None and u.eta > snap.now:
        return 0.0
    job = snap.jobs.get(u.job_id or "") or snap.others.get(u.job_id or "")
    if u.task == RUN_JOB_TASK and job is not None:
        status, _, completed_at = job
        if status not in TERMINAL_STATUSES:
            return 0.0 if status == "running" else snap.now - u.delivered_at
        return snap.now - max(u.delivered_at, completed_at or u.delivered_at)
    return snap.now - max(u.delivered_at, u.eta or 0.0)


def judge_broker(snap: Snapshot, bound_s: float) -> list[Violation]:
    """I6: no message unacked past its need, no stream entry pending, longer than `bound_s`."""
    out = []
    for u in sorted(snap.unacked, key=lambda u: u.delivered_at):
        idle = _idle_s(u, snap)
        if idle > bound_s:
            job = snap.jobs.get(u.job_id or "") or snap.others.get(u.job_id or "")
            detail = (
                f"unacked {u.task} for job {u.job_id} ({job[0] if job else 'unknown'}) "
                f"delivered {snap.now - u.delivered_at:.0f} s ago, unneeded for {idle:.0f} s "
                f"(delivery tag {u.tag})"
            )
            out.append(Violation("I6", "stale_unacked", detail))
    for key, group, n in snap.stream_pending:
        detail = f"stream {key} group {group}: {n} entries pending over {bound_s:g} s"
        out.append(Violation("I6", "stale_pending", detail))
    return out

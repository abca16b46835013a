"""The judges (pure, over plain rows): each takes what `check()` read and returns the violations
of its invariant. I5 is `services.workers.billing.check` itself (gather.py reads it).
"""

from __future__ import annotations

import hmac
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime

from standardwebhooks import Webhook

from common.protocol import RUN_JOB_TASK
from tests.faults.invariants.evidence import (
    LIFETIME_TOLERANCE_S,
    ONCE_PER_JOB_EVENTS,
    PLATFORM_FAULTS,
    TERMINAL_STATUSES,
    WEBHOOK_TOLERANCE_S,
    Snapshot,
    Unacked,
    Violation,
    WebhookEvidence,
)
from tests.faults.receiver import Delivery


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

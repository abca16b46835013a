"""Which broker wake-ups nothing needs any more: kombu's unacked entries against the jobs.

A worker acks a job's wake-up after storing the job's outcome. A worker that dies first (a
SIGKILL, a lost broker connection) never acks it, and kombu's Redis transport keeps the
message in its `unacked` hash until the visibility timeout (an hour) and then delivers it
again. The platform needs none of that: the database is the truth, the reconciler requeues the
jobs of dead workers and re-sends the wake-ups of pending jobs whose queue is empty, and a
redelivered wake-up only finds its job claimed or done. So the reconciler forgets an entry as
soon as nothing can need it:

- its job ended (after `grace_s`, the time a live worker takes to ack after storing);
- its job waits for a worker (queued, starting): the worker it was delivered to did not claim
  it within `grace_s`, so it is gone or will find the job claimed or redispatched;
- its job is unknown (deleted, or not a job wake-up of ours it was meant for).

A running job's entries stay until it ends: one of them is its live worker's, which acks it.

The control plane's own Celery tasks (webhook deliveries, output followers) are held the same
way by the Celery worker running them; one killed leaves its messages in `unacked` too. Such an
entry is forgotten `grace_s` after its handling was due (its countdown's eta, else its
delivery): a live Celery worker has acked it by then or still runs it, which needs no entry,
and a lost `*.completed` webhook is sent again from the database (`reconcile/webhooks.py`).

Pure: the reconciler gathers the entries and the jobs' states (`reconcile.jobs`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from common.protocol import RUN_JOB_TASK, job_of_message
from control_plane.domain.states import TERMINAL, JobStatus


@dataclass(frozen=True, slots=True)
class Unacked:
    """One delivered, unacknowledged wake-up of a job."""

    tag: str  # kombu's delivery tag (the key in `unacked` and `unacked_index`)
    delivered_at: float  # epoch seconds (the score in `unacked_index`)
    job_id: str | None  # a job's wake-up: its job; None: a control-plane task
    eta: float | None = None  # a control-plane task's countdown: due then (epoch seconds)


@dataclass(frozen=True, slots=True)
class JobState:
    status: str
    completed_at: float | None  # epoch seconds, once terminal


def job_of(raw: bytes | str) -> str | None:
    """The job id of a kombu `unacked` value (`[payload, exchange, routing_key]`) when it is a
    job's wake-up (task RUN_JOB_TASK, Celery protocol v2); None for anything else."""
    try:
        payload = json.loads(raw)[0]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return job_of_message(payload)


def control_task_eta(raw: bytes | str) -> float | None:
    """For a kombu `unacked` value that is a Celery task other than a job's wake-up: when it is
    due (its eta in epoch seconds, 0.0 when it has none); None for anything else."""
    try:
        headers = json.loads(raw)[0].get("headers") or {}
        task, eta = headers.get("task"), headers.get("eta")
        if not isinstance(task, str) or task == RUN_JOB_TASK:
            return None
        return datetime.fromisoformat(eta).timestamp() if isinstance(eta, str) else 0.0
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def stale(
    entries: Iterable[Unacked], jobs: Mapping[str, JobState], now: float, grace_s: float
) -> list[str]:
    """Delivery tags of the entries nothing needs any more (see the module's rules)."""
    out = []
    for e in entries:
        job = jobs.get(e.job_id) if e.job_id is not None else None
        if e.job_id is None:
            since = max(e.delivered_at, e.eta or 0.0)
        elif job is None:
            since = e.delivered_at
        elif job.status == JobStatus.RUNNING:
            continue
        elif job.status in TERMINAL:
            since = max(e.delivered_at, job.completed_at or e.delivered_at)
        else:
            since = e.delivered_at
        if now - since > grace_s:
            out.append(e.tag)
    return out

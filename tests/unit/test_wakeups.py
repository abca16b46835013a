"""Which unacked wake-ups the reconciler forgets (domain/wakeups.py), on plain values."""

from __future__ import annotations

import base64
import json

from common.protocol import RUN_JOB_TASK
from control_plane.domain.wakeups import JobState, Unacked, control_task_eta, job_of, stale

GRACE = 10.0
NOW = 1000.0


def entry(tag: str, delivered_at: float, job_id: str = "job_1") -> Unacked:
    return Unacked(tag, delivered_at, job_id)


def test_a_running_jobs_wake_ups_stay_however_old() -> None:
    jobs = {"job_1": JobState("running", None)}
    assert stale([entry("a", NOW - 3600), entry("b", NOW - 1)], jobs, NOW, GRACE) == []


def test_an_ended_jobs_wake_ups_go_once_the_grace_after_its_end_passed() -> None:
    jobs = {"job_1": JobState("succeeded", NOW - 5), "job_2": JobState("failed", NOW - 11)}
    entries = [entry("old_delivery_recent_end", NOW - 500), entry("b", NOW - 500, "job_2")]
    assert stale(entries, jobs, NOW, GRACE) == ["b"]


def test_a_waiting_jobs_wake_up_goes_when_no_worker_claimed_it_within_the_grace() -> None:
    jobs = {"job_1": JobState("queued", None), "job_2": JobState("starting", None)}
    entries = [entry("fresh", NOW - 2), entry("unclaimed", NOW - 11, "job_2")]
    assert stale(entries, jobs, NOW, GRACE) == ["unclaimed"]


def test_an_unknown_jobs_wake_up_goes_after_the_grace() -> None:
    assert stale([entry("a", NOW - 11), entry("b", NOW - 9)], {}, NOW, GRACE) == ["a"]


def test_a_control_tasks_entry_goes_once_the_grace_after_it_was_due_passed() -> None:
    """A webhook delivery held by a Celery worker that was killed: due at its delivery, or at
    its countdown's eta; its job's state does not matter."""
    jobs = {"job_1": JobState("running", None)}
    entries = [
        Unacked("handled_long_ago", NOW - 11, None),
        Unacked("being_handled", NOW - 9, None),
        Unacked("countdown_ahead", NOW - 600, None, eta=NOW + 60),
        Unacked("countdown_over", NOW - 600, None, eta=NOW - 11),
    ]
    assert stale(entries, jobs, NOW, GRACE) == ["handled_long_ago", "countdown_over"]


def test_control_task_eta_reads_other_tasks_and_their_countdown() -> None:
    webhook = "control_plane.deliver_webhook"
    assert control_task_eta(kombu_value(webhook, {"job_id": "job_9"})) == 0.0
    later = kombu_value(webhook, {}, eta="2026-11-23T12:00:00+00:00")
    assert control_task_eta(later) == 1795435200.0
    assert control_task_eta(kombu_value(RUN_JOB_TASK, {"job_id": "job_9"})) is None
    for junk in (b"", b"[]", b"not json", json.dumps([{"headers": {}}]).encode()):
        assert control_task_eta(junk) is None


def kombu_value(
    task: str, kwargs: object, encoding: str = "base64", eta: str | None = None
) -> bytes:
    body = json.dumps([[], kwargs, {}]).encode()
    payload = {
        "body": base64.b64encode(body).decode() if encoding == "base64" else body.decode(),
        "headers": {"task": task, "eta": eta},
        "properties": {"body_encoding": encoding},
    }
    return json.dumps([payload, "exchange", "routing"]).encode()


def test_job_of_reads_a_celery_wake_up_and_nothing_else() -> None:
    assert job_of(kombu_value(RUN_JOB_TASK, {"job_id": "job_9"})) == "job_9"
    assert job_of(kombu_value(RUN_JOB_TASK, {"job_id": "job_9"}, "utf-8")) == "job_9"
    assert job_of(kombu_value("control_plane.deliver_webhook", {"job_id": "job_9"})) is None
    assert job_of(kombu_value(RUN_JOB_TASK, {"job_id": 7})) is None
    assert job_of(kombu_value(RUN_JOB_TASK, {})) is None
    for junk in (b"", b"not json", b"[]", b'[{"body": "%%%"}]', b'[{"headers": {"task": 1}}]'):
        assert job_of(junk) is None

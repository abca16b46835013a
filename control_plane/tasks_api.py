"""Names and senders of the control plane's own Celery tasks (used by the API and the reconciler).

Kept free of task bodies, so senders do not import the Celery worker module.
"""

from __future__ import annotations

from celery import Celery

CONTROL_QUEUE = "platform.control"
DELIVER_WEBHOOK_TASK = "control_plane.deliver_webhook"
FOLLOW_OUTPUT_TASK = "control_plane.follow_job_output"


def enqueue_webhook(
    app: Celery, job_id: str, event_type: str, msg_id: str, attempt: int = 1
) -> None:
    """Deliver `event_type` (job.starting | job.started | job.output | job.completed) of a job
    (with retries, but for the best-effort ones), from `attempt` on."""
    app.send_task(
        DELIVER_WEBHOOK_TASK,
        kwargs={"job_id": job_id, "event_type": event_type, "msg_id": msg_id, "attempt": attempt},
        queue=CONTROL_QUEUE,
    )


def enqueue_batch_webhook(
    app: Celery, batch_id: str, event_type: str, msg_id: str, attempt: int = 1
) -> None:
    """Deliver `event_type` (batch.completed) of a batch, with retries, from `attempt` on."""
    app.send_task(
        DELIVER_WEBHOOK_TASK,
        kwargs={
            "batch_id": batch_id,
            "event_type": event_type,
            "msg_id": msg_id,
            "attempt": attempt,
        },
        queue=CONTROL_QUEUE,
    )


def enqueue_output_follower(app: Celery, job_id: str, attempt: int) -> None:
    """Start sending throttled `job.output` webhooks for this attempt of a running job.

    Call it when a job that asked for "output" events is claimed; a second follower of the same
    attempt stops at once, so calling it twice is harmless.
    """
    app.send_task(
        FOLLOW_OUTPUT_TASK,
        kwargs={"job_id": job_id, "attempt": attempt, "seq": 0, "sent_id": None},
        queue=CONTROL_QUEUE,
    )

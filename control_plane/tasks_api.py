"""Names and senders of the control plane's own Celery tasks (used by API and loops)."""

from __future__ import annotations

from celery import Celery

CONTROL_QUEUE = "platform.control"
DELIVER_WEBHOOK_TASK = "control_plane.deliver_webhook"


def enqueue_webhook(app: Celery, job_id: str, event_type: str, msg_id: str) -> None:
    app.send_task(
        DELIVER_WEBHOOK_TASK,
        kwargs={"job_id": job_id, "event_type": event_type, "msg_id": msg_id, "attempt": 1},
        queue=CONTROL_QUEUE,
    )

"""The plan of the lost-webhook sweep: each ended job or completed batch whose `*.completed`
webhook is still pending, and whose delivery chain was lost (no attempt recorded, or the next
one overdue: `webhook_resend.attempt_to_resend`), gets that attempt enqueued again."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from control_plane.domain.plans.actions import ResendWebhook
from control_plane.domain.webhook_resend import Recorded, attempt_to_resend


def plan_resend(
    subjects: Sequence[tuple[str, datetime]],
    last: dict[str, Recorded],
    event: str,
    first_msg_id: dict[str, str],
    schedule_s: tuple[float, ...],
    now: datetime,
) -> list[ResendWebhook]:
    """`subjects`: (id, when it ended) of the pending ones; `last`: each one's latest recorded
    attempt; `first_msg_id`: the message id its first attempt has (the one a resend keeps
    when none was recorded)."""
    out = []
    for sid, ended_at in subjects:
        rec = last.get(sid)
        again = attempt_to_resend(now, ended_at, rec, schedule_s)
        if again is not None:
            msg_id = rec.msg_id if rec is not None else first_msg_id[sid]
            out.append(ResendWebhook(sid, event, msg_id, again))
    return out

"""A job.completed webhook lost with a killed API or Celery worker is sent again by the
reconciler, once per chain, and one already delivered or too recent is not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis

from control_plane.db.models import Job
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.jobs.dispatch import make_celery
from tests.integration.webhooks.helpers import Env, deliveries, deploy, job, submit, unique


def test_a_lost_completed_webhook_is_sent_again_by_the_reconciler(
    env: Env, keys: dict[str, str]
) -> None:
    """Two lost chains, as a killed API (ended, never enqueued) and a killed Celery worker
    (attempt 1 recorded, its retry's message gone) leave them; and two that are not lost."""
    from control_plane.db.models import WebhookDelivery
    from control_plane.domain.webhook_resend import GRACE
    from control_plane.reconcile import webhooks
    from control_plane.reconcile.env import Env as ReconcileEnv
    from control_plane.services.webhooks.signing import message_id

    deploy(env, keys["a"])
    names = ("never", "retry", "recent", "done", "stuck")
    paths = {name: unique(f"/lost/{name}") for name in names}
    ids = {name: submit(env, keys["a"], env.receiver.url(p)) for name, p in paths.items()}
    now = datetime.now(UTC)
    long_ago = now - GRACE - timedelta(minutes=5)
    engine = make_engine(env.settings.database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s:
        for name, jid in ids.items():
            job_row = s.get(Job, jid)
            assert job_row is not None
            job_row.status, job_row.webhook_status = "succeeded", "pending"
            if name == "stuck":  # delivery finds no URL, records nothing: pending for good
                job_row.webhook_url = None
            job_row.completed_at = now if name == "recent" else long_ago
            if name in ("retry", "done"):
                s.add(
                    WebhookDelivery(
                        job_id=jid,
                        url=env.receiver.url(paths[name]),
                        msg_id=message_id(jid, "completed"),
                        event_type="job.completed",
                        attempt=1,
                        status_code=200 if name == "done" else 500,
                        delivered=name == "done",
                        created_at=long_ago,
                    )
                )
        s.commit()
        r = redis.Redis.from_url(env.settings.redis_url)
        renv = ReconcileEnv(env.settings, r, make_celery(env.settings), None)  # type: ignore[arg-type]
        assert webhooks.resend_lost(s, renv, now) == 3  # "never", "retry" and "stuck"
    for name in ("never", "retry"):
        got = env.wait(name, lambda n=name: env.receiver.at(paths[n]))  # type: ignore[misc]
        assert {g.headers["webhook-id"] for g in got} == {message_id(ids[name], "completed")}
        log = env.wait(
            f"{name} recorded",
            lambda n=name: [d for d in deliveries(env, keys["a"], ids[n]) if d["delivered"]],
        )
        assert [d["attempt"] for d in log] == [1 if name == "never" else 2]
        assert job(env, keys["a"], ids[name])["webhook_status"] == "delivered"
    # delivered now: nothing more to send, even a minute later
    with sessions() as s:
        # only "recent": "stuck" is still pending but was sent again just now (once per
        # RESEND_EVERY_S, not at every sweep)
        assert webhooks.resend_lost(s, renv, now + timedelta(minutes=1)) == 1
    r.close()
    engine.dispose()
    assert env.receiver.at(paths["done"]) == []

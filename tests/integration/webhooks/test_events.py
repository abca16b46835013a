"""The events beyond a job's end: throttled job.output events carrying the text so far (of
the attempt that runs), batch.completed, and a job.starting event for each phase of a cold start."""

from __future__ import annotations

import itertools
import json
import time
from datetime import UTC, datetime, timedelta

import redis
from sqlalchemy import select

from common.protocol import EventType
from control_plane.db.models import Job
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile import batches as batch_reconciler
from control_plane.reconcile.env import Env as ReconcileEnv
from control_plane.services.jobs import events
from control_plane.services.jobs.dispatch import make_celery
from control_plane.tasks_api import enqueue_output_follower
from tests.integration.api_helpers import WORKER, h
from tests.integration.webhooks.helpers import (
    OUTPUT_INTERVAL_S,
    Env,
    claim,
    complete,
    deploy,
    submit,
    unique,
    verify,
)


def test_output_events_are_throttled_and_carry_the_text_so_far(
    env: Env, keys: dict[str, str]
) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    jid = submit(env, keys["a"], env.receiver.url(path), ["output", "completed"])
    attempt = claim(env, jid)
    celery = make_celery(env.settings)
    r = redis.Redis.from_url(env.settings.redis_url)
    # What the lead's claim route does for jobs asking for "output"; a second follower of the
    # same attempt stops at once.
    enqueue_output_follower(celery, jid, attempt)
    enqueue_output_follower(celery, jid, attempt)
    pieces = [f"tok{i} " for i in range(30)]
    for i, p in enumerate(pieces):
        events.publish(r, jid, EventType.OUTPUT, {"delta": p, "attempt": attempt})
        if i % 10 == 5:  # a late delta of an attempt lost before this one: not this text
            events.publish(r, jid, EventType.OUTPUT, {"delta": "stale ", "attempt": attempt - 1})
        time.sleep(0.05)
    time.sleep(OUTPUT_INTERVAL_S * 3)  # the follower sends the last text before completion
    complete(env, jid, attempt, text="".join(pieces))
    env.wait(
        "job.completed",
        lambda: any(x.json()["type"] == "job.completed" for x in env.receiver.at(path)),
    )
    time.sleep(OUTPUT_INTERVAL_S)  # a late output event would show up now
    got = env.receiver.at(path)
    outputs = [x for x in got if x.json()["type"] == "job.output"]
    texts = [x.json()["data"]["output"]["text"] for x in outputs]
    assert 2 <= len(outputs) <= 1.5 / OUTPUT_INTERVAL_S + 3, texts
    assert len({x.headers["webhook-id"] for x in outputs}) == len(outputs)
    assert all("".join(pieces).startswith(t) for t in texts)
    assert texts == sorted(texts, key=len) and texts[-1] == "".join(pieces)
    # Sent an interval apart at least; received with each delivery's own delay, so one gap may
    # shrink by what the delivery before it was late (0.23 s on a loaded machine), never all.
    gaps = [b.at - a.at for a, b in itertools.pairwise(outputs)]
    assert sum(gaps) >= len(gaps) * OUTPUT_INTERVAL_S * 0.7, gaps
    assert got[-1].json()["data"]["output"]["text"] == "".join(pieces)
    r.close()


def test_batch_completed_webhook(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    body = {"deployment": "demo", "inputs": [{"prompt": "a"}, {"prompt": "b"}]}
    r = env.client.post(
        "/v1/batches", json={**body, "webhook": env.receiver.url(path)}, headers=h(keys["a"])
    )
    assert r.status_code == 201, r.text
    batch = r.json()
    assert batch["webhook_status"] == "pending"
    engine = make_engine(env.settings.database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s:
        ids = list(s.scalars(select(Job.id).where(Job.batch_id == batch["id"])))
    for jid in ids:
        complete(env, jid, claim(env, jid), text=f"out {jid}")
    r = redis.Redis.from_url(env.settings.redis_url)
    with sessions() as s:
        renv = ReconcileEnv(env.settings, r, make_celery(env.settings), None)  # type: ignore[arg-type]
        batch_reconciler.pump(s, renv, datetime.now(UTC))
    [got] = env.wait("batch.completed", lambda: env.receiver.at(path))
    secret = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    msg = verify(secret, got)
    assert msg["type"] == "batch.completed" and msg["data"]["id"] == batch["id"]
    assert msg["data"]["counts"]["succeeded"] == 2 and msg["data"]["results_uri"]
    path_b = f"/v1/batches/{batch['id']}"
    env.wait(
        "delivered",
        lambda: (
            env.client.get(path_b, headers=h(keys["a"])).json()["webhook_status"] == "delivered"
        ),
    )
    log = env.client.get(f"{path_b}/webhook/deliveries", headers=h(keys["a"])).json()["data"]
    assert [(d["event_type"], d["delivered"]) for d in log] == [("batch.completed", True)]
    r.close()
    engine.dispose()


def test_a_job_asking_for_starting_events_hears_each_phase_of_its_cold_start(
    env: Env, keys: dict[str, str]
) -> None:
    from bench.reconciler_tick import RecordingProvider
    from common.protocol import worker_heartbeat_key
    from control_plane.reconcile.driver import Reconciler
    from control_plane.reconcile.env import Env as ReconcilerEnv

    deploy(env, keys["a"])
    path = unique("/starting")
    jid = submit(env, keys["a"], env.receiver.url(path), ["starting"])
    r = redis.Redis.from_url(env.settings.redis_url)
    provider = RecordingProvider()
    loop = Reconciler(
        ReconcilerEnv(env.settings, r, make_celery(env.settings), provider),
        make_sessionmaker(make_engine(env.settings.database_url)),
    )
    t0 = datetime.now(UTC) - timedelta(seconds=60)
    loop.tick(t0)
    # (other tests' deployments live on in this database: find this one's worker)
    dep_id = env.client.get("/v1/deployments/demo", headers=h(keys["a"])).json()["id"]
    (wid,) = [
        s.worker_id
        for s in provider.started
        if s.assignment and s.assignment.deployment_id == dep_id
    ]
    env.wait("job.starting (booting)", lambda: env.receiver.at(path))
    state = {"state": "loading", "at": (t0 + timedelta(seconds=1)).timestamp()}
    assert env.client.post(f"/internal/workers/{wid}/state", json=state, headers=WORKER).is_success
    beat = {"state": "loading", "progress": {"bytes_done": 10, "bytes_total": 100}}
    r.set(worker_heartbeat_key(wid), json.dumps(beat), ex=10)
    loop.tick(t0 + timedelta(seconds=2))
    loop.tick(t0 + timedelta(seconds=2.5))  # progress within the phase: no second webhook
    got = env.wait(
        "job.starting (loading)", lambda: env.receiver.at(path)[1:] and env.receiver.at(path)
    )
    secret = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    events = [verify(secret, m) for m in got]
    assert [e["type"] for e in events] == ["job.starting", "job.starting"]
    assert all(e["data"]["id"] == jid and e["data"]["status"] == "starting" for e in events)
    loading = events[1]["data"]
    assert loading["status_reason"] == "loading_weights"
    assert loading["cold_start"]["phase"] == "loading_weights"
    assert loading["cold_start"]["bytes_total"] == 100
    assert len({m.headers["webhook-id"] for m in got}) == 2
    time.sleep(0.5)
    assert len(env.receiver.at(path)) == 2

"""The control plane's own spans, and trace ids in log lines: a cold-started job's `job.queue`
shows the boot and load of the worker it waited on (and why that worker was started); the
reconciler records a tick that acted (not one that did nothing); a job requeued after its
worker died gets `job.requeue` in its own trace; a webhook attempt is `webhook.deliver` in its
job's trace. Real Redis and SQL, the app in process, the reconciler with a recording provider,
every span in an in-memory exporter (the worker's and engine's spans: test_tracing.py).
"""

from __future__ import annotations

import io
import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from common import logs
from common.protocol import worker_heartbeat_key
from control_plane.api.app import create_app
from control_plane.db.models import Worker
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile import tick_trace
from control_plane.reconcile.driver import Reconciler
from control_plane.services.jobs import webhook_delivery
from control_plane.services.jobs.webhook_delivery import DeliveryEnv, Message
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER, deploy, h
from tests.integration.conftest import SteppedClock, lines_of, provider
from tests.integration.webhooks.receiver import Receiver

PROMPT = "Tangerine okapi lighthouse, private prompt 5532"
STEPS = {"workers", "jobs", "scale", "pool", "batches", "billing", "sweeps"}


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def _drawn(tick: ReadableSpan) -> dict[str, Any]:
    """What made a tick worth a trace: its actions, its error, or its length (slow)."""
    ms = ((tick.end_time or 0) - (tick.start_time or 0)) / 1e6
    return {"events": [e.name for e in tick.events], "status": tick.status.status_code, "ms": ms}


def hex_ids(s: ReadableSpan) -> tuple[str, str]:
    return f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}"


def test_a_cold_started_jobs_trace_shows_its_wait_the_ticks_that_acted_and_its_requeue(
    spans: InMemorySpanExporter,
    log_lines: io.StringIO,
    settings: Settings,
    keys: dict[str, str],
    redis_client: Any,
    clock: SteppedClock,
    loop: Reconciler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A tick is also drawn for its length alone (tests/unit/test_tick_trace.py); on a loaded
    # machine the tick that changes nothing below can take that long, so only what ticks do
    # decides here.
    monkeypatch.setattr(tick_trace, "SLOW_TICK_S", 3600.0)
    with TestClient(create_app(settings, clock=clock)) as client:  # tracing on: traced requests
        deploy(client, keys["a"])
        r = client.post(
            "/v1/deployments/demo/jobs", json={"input": {"prompt": PROMPT}}, headers=h(keys["a"])
        )
        assert r.status_code == 202, r.text
        jid = r.json()["id"]
        (admit,) = named(spans, "job.admit")
        trace_id, admit_span = hex_ids(admit)
        # the request's own line (written after its span ended) names the trace
        (request_line,) = [
            line
            for line in lines_of(log_lines)
            if line.get("route") == "/v1/deployments/{name}/jobs"
        ]
        assert request_line["trace_id"] == trace_id and request_line["job_id"] == jid
        (request_span,) = named(spans, "POST /v1/deployments/{name}/jobs")
        assert request_line["span_id"] == hex_ids(request_span)[1]

        # a tick that starts a worker is recorded, with its steps and what it did
        loop.tick(datetime.now(UTC))
        (wid,) = [s.worker_id for s in provider(loop).started]
        (tick,) = named(spans, "reconcile.tick")
        assert tick.parent is None and hex_ids(tick)[0] != trace_id  # a trace of its own
        steps = [s for s in spans.get_finished_spans() if s.parent == tick.context]
        assert {s.name for s in steps} == STEPS
        assert all(tick.start_time <= s.start_time for s in steps)  # type: ignore[operator]
        (start,) = [e for e in tick.events if e.name == "worker.start"]
        with loop.sessions() as session:
            worker = session.get(Worker, wid)
            assert worker is not None
            reason = worker.reason
        assert reason
        assert dict(start.attributes or {}) == {
            "platform.worker.id": wid,
            "platform.deployment.id": worker.deployment_id,
            "platform.worker.reason": reason,
            "platform.worker.placement": dict(start.attributes or {})["platform.worker.placement"],
        }
        # one that changes nothing is not
        redis_client.set(worker_heartbeat_key(wid), "{}", ex=30)
        loop.tick(datetime.now(UTC))
        ticks = named(spans, "reconcile.tick")
        assert len(ticks) == 1, [_drawn(t) for t in ticks[1:]]  # why another was drawn

        # the worker loads and claims the job: the job's wait shows where its time went
        for state in ("loading", "idle"):
            time.sleep(0.1)  # 0.1 s of boot, then of load
            r = client.post(
                f"/internal/workers/{wid}/state",
                json={"state": state, "at": time.time()},
                headers=WORKER,
            )
            assert r.status_code == 200, r.text
        r = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
        assert r.json()["claimed"] is True

    (queue,) = named(spans, "job.queue")
    assert hex_ids(queue)[0] == trace_id and f"{queue.parent.span_id:016x}" == admit_span  # type: ignore[union-attr]
    phases = {s.name: s for s in spans.get_finished_spans() if s.parent == queue.context}
    assert set(phases) == {"worker.boot", "worker.load"}
    boot, load = phases["worker.boot"], phases["worker.load"]
    assert queue.start_time <= boot.start_time <= boot.end_time <= load.start_time  # type: ignore[operator]
    assert load.end_time <= queue.end_time  # type: ignore[operator]
    assert load.end_time - load.start_time >= 100_000_000  # type: ignore[operator]
    for p in (boot, load):
        a = dict(p.attributes or {})
        assert a["platform.worker.id"] == wid and a["platform.worker.start_reason"] == reason
        assert a["platform.worker.accelerator"] == "cpu"

    # its worker goes silent: the tick that fails it and requeues the job is recorded, and the
    # requeue is in the job's own trace, from the worker's end to the requeue
    redis_client.delete(worker_heartbeat_key(wid))
    loop.tick(datetime.now(UTC) + timedelta(seconds=60))
    ticks = named(spans, "reconcile.tick")
    assert len(ticks) == 2
    acted = {e.name: dict(e.attributes or {}) for e in ticks[1].events}
    assert acted["worker.lost"] == {
        "platform.worker.id": wid,
        "platform.worker.reason": "heartbeat_lost",
    }
    assert acted["job.requeue"] == {"platform.job.id": jid, "platform.job.attempt": 1}
    (requeue,) = named(spans, "job.requeue")
    assert hex_ids(requeue)[0] == trace_id and f"{requeue.parent.span_id:016x}" == admit_span  # type: ignore[union-attr]
    assert dict(requeue.attributes or {})["platform.job.reason"] == "worker_lost"
    # never the prompt, in any span or log line
    for s in spans.get_finished_spans():
        assert PROMPT not in json.dumps(s.to_json()), s.name
    assert PROMPT not in log_lines.getvalue()


def test_a_webhook_attempt_is_a_client_span_in_its_jobs_trace(
    spans: InMemorySpanExporter, settings: Settings, keys: dict[str, str], redis_client: Any
) -> None:
    open_settings = settings.model_copy(update={"webhook_allow_private": True})
    receiver = Receiver()
    engine = make_engine(settings.database_url)
    http = httpx.Client(timeout=5)
    env = DeliveryEnv(open_settings, make_sessionmaker(engine), http, redis_client)
    try:
        with TestClient(create_app(open_settings)) as client:
            deploy(client, keys["a"])
            outcomes = {}
            for path in ("/ok/trace", "/fail/trace"):
                body = {"input": {"prompt": PROMPT}, "webhook": receiver.url(path)}
                r = client.post("/v1/deployments/demo/jobs", json=body, headers=h(keys["a"]))
                assert r.status_code == 202, r.text
                jid = r.json()["id"]
                done = {"worker_id": "w", "attempt": 1, "status": "succeeded", "output": {}}
                client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": "w"}, headers=WORKER)
                r = client.post(f"/internal/jobs/{jid}/complete", json=done, headers=WORKER)
                assert r.status_code == 200, r.text
                msg = Message("job.completed", f"msg_{jid}", 1, job_id=jid)
                with logs.log_context(job_id=jid):  # as the Celery task's context
                    webhook_delivery.deliver(env, msg, datetime.now(UTC), random.Random(0))
                    outcomes[path] = (jid, logs.current_ids())
    finally:
        http.close()
        engine.dispose()
        receiver.close()

    for path, status, outcome in (
        ("/ok/trace", 200, "delivered"),
        ("/fail/trace", 500, "retrying"),
    ):
        jid, ids = outcomes[path]
        (admit,) = [
            s
            for s in named(spans, "job.admit")
            if dict(s.attributes or {})["platform.job.id"] == jid
        ]
        (sent,) = [
            s
            for s in named(spans, "webhook.deliver")
            if dict(s.attributes or {})["platform.job.id"] == jid
        ]
        assert sent.kind is SpanKind.CLIENT
        assert sent.parent is not None and sent.parent.span_id == admit.context.span_id
        assert hex_ids(sent)[0] == hex_ids(admit)[0]
        a = dict(sent.attributes or {})
        assert a["platform.webhook.event"] == "job.completed"
        assert a["platform.webhook.attempt"] == 1 and a["platform.webhook.id"] == f"msg_{jid}"
        assert a["http.response.status_code"] == status
        assert a["platform.webhook.outcome"] == outcome
        assert (sent.status.status_code is StatusCode.ERROR) == (status != 200)
        # never the receiver's URL (it may carry a token), nor anything of the job's text
        assert "127.0.0.1" not in json.dumps(sent.to_json()) and PROMPT not in json.dumps(
            sent.to_json()
        )
        # the task's later lines name the attempt's span
        assert (ids["trace_id"], ids["span_id"]) == hex_ids(sent)

"""The control plane's /metrics and the workers' service discovery, through the real API on
real Redis and SQL (SQLite and PostgreSQL): the exposition parsed with prometheus_client's
parser, its values checked against the jobs, workers, billing records and decisions behind
them; only the operator's admin keys may read either."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from common.protocol import HEARTBEAT_METRICS_FIELD, worker_heartbeat_key
from control_plane.db.models import Deployment
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile.driver import Reconciler
from control_plane.services.jobs import webhook_delivery
from control_plane.services.jobs.webhook_delivery import DeliveryEnv, Message
from control_plane.services.scaling import scale_decisions
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER, deploy, h, submit
from tests.integration.conftest import SteppedClock, provider

Samples = list[tuple[str, dict[str, str], float]]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The integration tests' settings (conftest), with webhook targets on loopback allowed:
    the receiver of the delivery test."""
    return settings.model_copy(update={"webhook_allow_private": True})


def scrape(client: TestClient, key: str) -> Samples:
    r = client.get("/metrics", headers=h(key))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    ]


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    return sum(
        v for n, lb, v in samples if n == name and all(lb.get(k) == x for k, x in labels.items())
    )


def count(samples: Samples, name: str) -> int:
    return sum(1 for n, _, _ in samples if n == name)


def report(client: TestClient, wid: str, state: str, at: datetime) -> None:
    r = client.post(
        f"/internal/workers/{wid}/state",
        json={"state": state, "at": at.timestamp()},
        headers=WORKER,
    )
    assert r.status_code == 200, r.text


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def test_a_job_that_ends_is_counted_and_timed_and_the_fleet_gauges_match(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    clock: SteppedClock,
    settings: Settings,
) -> None:
    key = keys["a"]
    deploy(client, key)
    before = scrape(client, key)
    jid = submit(client, key)
    loop.tick(clock())  # scale from zero: a worker boots for it
    wid = provider(loop).started[-1].worker_id
    for state, after_s in (("loading", 2.0), ("warming", 3.0), ("idle", 1.0)):
        report(client, wid, state, clock.advance(after_s))
    clock.advance(0.5)
    claimed = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
    assert claimed.status_code == 200, claimed.text
    clock.advance(1.5)
    timings = {"ttft_s": 0.25, "itl_mean_s": 0.02, "e2e_s": 1.4}
    body = {
        "worker_id": wid,
        "attempt": claimed.json()["attempt"],
        "status": "succeeded",
        "output": {"text": "t", "finish_reason": "length", "timings": timings},
        "prompt_tokens": 3,
        "generated_tokens": 8,
    }
    done = client.post(f"/internal/jobs/{jid}/complete", json=body, headers=WORKER)
    assert done.status_code == 200, done.text
    loop.tick(clock())
    after = scrape(client, key)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    job = client.get(f"/v1/jobs/{jid}", headers=h(key)).json()
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as s:
        tenant = s.scalars(select(Deployment.tenant_id).where(Deployment.name == "demo")).one()
    engine.dispose()
    mine = {"deployment": "demo", "tenant": tenant, "kind": "async"}
    # the job: counted by its status, its latencies from its own timestamps
    assert delta("platform_jobs_ended_total", **mine, status="succeeded") == 1
    queue_s = seconds(job["created_at"], job["started_at"])
    assert queue_s >= 6.5, "it waited through the cold start"
    assert delta("platform_job_queue_delay_seconds_count", **mine) == 1
    assert delta("platform_job_queue_delay_seconds_sum", **mine) == pytest.approx(queue_s)
    assert delta("platform_job_time_to_first_token_seconds_sum", **mine) == pytest.approx(
        queue_s + 0.25
    )
    e2e = seconds(job["created_at"], job["completed_at"])
    assert delta("platform_job_e2e_latency_seconds_sum", **mine, status="succeeded") == (
        pytest.approx(e2e)
    )
    assert delta("platform_job_e2e_latency_seconds_bucket", **mine, le="+Inf") == 1
    assert delta("platform_job_mean_inter_token_latency_seconds_sum", **mine) == pytest.approx(0.02)
    assert delta("platform_job_mean_inter_token_latency_seconds_bucket", **mine, le="0.02") == 1
    # its worker's cold start: placed by a boot, each phase as long as its billing records
    assert delta("platform_cold_starts_total", accelerator="cpu", tier="boot") == 1
    records = client.get(
        "/v1/billing/records", params={"worker_id": wid, "limit": 100}, headers=h(key)
    ).json()["data"]
    for phase in ("boot", "load", "warm"):
        recorded = sum(float(r["seconds"]) for r in records if r["phase"] == phase)
        labels = {"phase": phase, "deployment": "demo", "tenant": tenant}
        assert delta("platform_cold_start_phase_seconds_count", **labels) == 1
        assert delta("platform_cold_start_phase_seconds_sum", **labels) == pytest.approx(
            recorded,
            abs=1e-3,  # the API shows milliseconds
        )
    for phase in ("boot", "load", "warm", "idle", "busy"):
        billed = sum(Decimal(r["billed_seconds"]) for r in records if r["phase"] == phase)
        assert delta("platform_billed_seconds_total", phase=phase, accelerator="cpu") == (
            pytest.approx(float(billed), abs=1e-3)
        ), phase
    # requests by route template and status (never the job's id in a label)
    assert (
        delta(
            "platform_http_requests_total",
            method="POST",
            route="/internal/jobs/{job_id}/complete",
            status="200",
        )
        == 1
    )
    assert all(jid not in json.dumps(labels) for _, labels, _ in after)

    # the state families, as the database and Redis have them now
    workers = client.get("/v1/workers", headers=h(key)).json()["data"]
    live = [w for w in workers if w["id"] == wid]
    assert live and live[0]["state"] == "idle"
    assert total(after, "platform_workers", state="idle", accelerator="cpu") == 1
    assert total(after, "platform_workers", state="busy", accelerator="cpu") == 0
    for status in ("queued", "starting", "running"):
        assert total(after, "platform_jobs_active", deployment="demo", status=status) == 0
    scaling = client.get("/v1/deployments/demo", headers=h(key)).json()["scaling"]
    assert (
        total(after, "platform_autoscaler_desired_workers", deployment="demo")
        == (scaling["desired"])
    )
    assert (
        total(after, "platform_autoscaler_actual_workers", deployment="demo") == (scaling["actual"])
    )
    decided = scale_decisions.counts(loop.env.redis)
    for reason, n in decided.items():
        assert total(after, "platform_scale_decisions_total", reason=reason) == n
    assert total(after, "platform_billing_drift_issues") == 0
    assert count(after, "platform_billing_drift_issues") == 1


def test_queued_jobs_and_booting_workers_show_while_they_wait(
    client: TestClient, keys: dict[str, str], loop: Reconciler, clock: SteppedClock
) -> None:
    key = keys["a"]
    deploy(client, key)
    submit(client, key)
    submit(client, key)
    m = scrape(client, key)
    assert total(m, "platform_jobs_active", deployment="demo", status="queued") == 2
    loop.tick(clock())
    m = scrape(client, key)
    assert total(m, "platform_jobs_active", deployment="demo", status="starting") == 2
    assert total(m, "platform_workers", state="booting", accelerator="cpu") == 1
    assert total(m, "platform_autoscaler_desired_workers", deployment="demo") >= 1


@pytest.fixture
def receiver() -> Iterator[str]:
    """A webhook receiver on loopback: /ok/… answers 200, /fail/… 500."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200 if self.path.startswith("/ok") else 500)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_webhook_attempts_are_counted_by_outcome(
    client: TestClient, keys: dict[str, str], settings: Settings, receiver: str
) -> None:
    key = keys["a"]
    deploy(client, key)
    ok = submit(client, key, webhook=f"{receiver}/ok")
    failing = submit(client, key, webhook=f"{receiver}/fail")
    before = scrape(client, key)
    engine = make_engine(settings.database_url)
    with httpx.Client() as http:
        env = DeliveryEnv(
            settings, make_sessionmaker(engine), http, redis.Redis.from_url(settings.redis_url)
        )
        now = datetime.now(UTC)
        last = len(settings.webhook_retry_schedule_s) + 1  # no retry after it
        for jid, attempt in ((ok, 1), (failing, 1), (failing, last)):
            msg = Message("job.completed", f"msg_{jid}_completed", attempt, job_id=jid)
            webhook_delivery.deliver(env, msg, now, random.Random(0))
        env.redis.close()
    engine.dispose()
    after = scrape(client, key)

    def delta(outcome: str) -> float:
        labels = {"event": "job.completed", "outcome": outcome}
        return total(after, "platform_webhook_deliveries_total", **labels) - total(
            before, "platform_webhook_deliveries_total", **labels
        )

    assert (delta("delivered"), delta("retrying"), delta("failed")) == (1, 1, 1)


def test_only_the_operators_admin_keys_read_metrics_and_targets(
    client: TestClient, keys: dict[str, str]
) -> None:
    for path in ("/metrics", "/metrics/workers"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers=h("sk_not_a_key")).status_code == 401
        assert client.get(path, headers=h(keys["b"])).status_code == 403, "another tenant"
        assert client.get(path, headers=h(keys["ro"])).status_code == 403, "a read-only key"
        assert client.get(path, headers=h(keys["a"])).status_code == 200


def test_service_discovery_lists_the_live_workers_that_serve_metrics(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    clock: SteppedClock,
    redis_client: Any,
) -> None:
    key = keys["a"]
    deploy(client, key)
    assert client.get("/metrics/workers", headers=h(key)).json() == []
    submit(client, key)
    loop.tick(clock())
    wid = provider(loop).started[-1].worker_id

    def beat(**fields: Any) -> list[dict[str, Any]]:
        redis_client.set(
            worker_heartbeat_key(wid), json.dumps({"state": "booting", **fields}), ex=10
        )
        r = client.get("/metrics/workers", headers=h(key))
        assert r.status_code == 200, r.text
        groups: list[dict[str, Any]] = r.json()
        return groups

    assert beat() == [], "no metrics address (yet)"
    assert beat(**{HEARTBEAT_METRICS_FIELD: "http://evil/?x=1"}) == [], "not host:port"
    assert beat(**{HEARTBEAT_METRICS_FIELD: "127.0.0.1:0"}) == []
    [group] = beat(**{HEARTBEAT_METRICS_FIELD: "127.0.0.1:41237"})
    assert group["targets"] == ["127.0.0.1:41237"]
    labels = group["labels"]
    assert labels["worker"] == wid and labels["deployment"] == "demo"
    assert labels["accelerator"] == "cpu" and labels["tenant"].startswith("ten_")
    # a stopped worker is no target any more, whatever its last heartbeat says
    report(client, wid, "stopped", clock())
    assert client.get("/metrics/workers", headers=h(key)).json() == []


def test_requests_are_counted_by_route_template_and_status(
    client: TestClient, keys: dict[str, str]
) -> None:
    key = keys["a"]
    before = scrape(client, key)
    assert client.get("/v1/jobs/job_does_not_exist", headers=h(key)).status_code == 404
    assert client.get("/no/such/path/job_123").status_code == 404
    after = scrape(client, key)

    def delta(route: str, status: str) -> float:
        labels = {"method": "GET", "route": route, "status": status}
        return total(after, "platform_http_requests_total", **labels) - total(
            before, "platform_http_requests_total", **labels
        )

    assert delta("/v1/jobs/{job_id}", "404") == 1
    assert delta("unmatched", "404") == 1
    assert delta("/metrics", "200") == 1  # the first scrape, counted by the second
    # and how long each took, by route template
    seconds = "platform_http_request_duration_seconds_count"
    timed = {"method": "GET", "route": "/v1/jobs/{job_id}"}
    assert total(after, seconds, **timed) - total(before, seconds, **timed) == 1
    slowest = "platform_http_request_duration_seconds_bucket"
    assert total(after, slowest, le="+Inf", **timed) == total(after, seconds, **timed)
    assert not [lb for _, lb, _ in after if "job_does_not_exist" in json.dumps(lb)]
    assert not [lb for _, lb, _ in after if "/no/such" in json.dumps(lb)]


def test_failed_workers_are_counted_by_the_kind_of_their_reason(
    client: TestClient, keys: dict[str, str], loop: Any, clock: SteppedClock
) -> None:
    key = keys["a"]
    deploy(client, key)
    submit(client, key)
    loop.tick(clock())
    wid = provider(loop).started[-1].worker_id
    before = scrape(client, key)
    r = client.post(
        f"/internal/workers/{wid}/state",
        json={"state": "failed", "at": clock().timestamp(), "reason": "OSError: disk full"},
        headers=WORKER,
    )
    assert r.status_code == 200, r.text
    after = scrape(client, key)
    failures = "platform_worker_failures_total"
    labels = {"accelerator": "cpu", "reason": "exception"}
    assert total(after, failures, **labels) - total(before, failures, **labels) == 1
    assert not [lb for _, lb, _ in after if "disk full" in json.dumps(lb)]  # a kind, not text

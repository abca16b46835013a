"""The Celery worker's own /metrics (PLATFORM_METRICS_PORT): a delivery it made is counted
there, where Prometheus scrapes it (the API's /metrics never sees another pod's events)."""

from __future__ import annotations

from tests.integration.test_process_metrics import scrape
from tests.integration.webhooks.helpers import Env, claim, complete, deploy, job, submit, unique


def _delivered(env: Env) -> float:
    return sum(
        value
        for (name, labels), value in scrape(_port(env)).items()
        if name == "platform_webhook_deliveries_total" and ("outcome", "delivered") in labels
    )


def test_a_delivery_is_counted_on_the_workers_port(env: Env, keys: dict[str, str]) -> None:
    before = env.wait("the worker's /metrics", lambda: _scraped(env))
    deploy(env, keys["a"])
    jid = submit(env, keys["a"], env.receiver.url(unique("/ok")))
    complete(env, jid, claim(env, jid))
    env.wait("delivered", lambda: job(env, keys["a"], jid)["webhook_status"] == "delivered")
    # the attempt is counted after its commit, a moment after the status reads delivered
    env.wait("the delivery counted", lambda: _delivered(env) == before[0] + 1)


def _scraped(env: Env) -> tuple[float] | None:
    try:
        return (_delivered(env),)
    except OSError:
        return None


def _port(env: Env) -> int:
    assert env.metrics_port is not None, "this env's Celery worker serves no /metrics"
    return env.metrics_port

"""A worker's calls to the control plane on the embedded platform (real processes): the claims
and reports of jobs that start and end together go in fewer requests than jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import Client

pytestmark = pytest.mark.e2e


def test_jobs_that_start_and_end_together_share_their_claims_and_reports(
    platform: dict[str, Any], demo_model: Path
) -> None:
    """A burst queued behind a cold start: what the worker sends the control plane while other
    requests of the same kind are under way goes together, in fewer requests than jobs, each
    job still ending once with its own output. Its reports of the jobs one engine step ends go
    together; its claims go together only when deliveries come faster than claims are
    answered. The consumer takes a wake-up as soon as a slot frees, one at a time, so on a
    loopback control plane that happens in some runs and not in others."""
    from prometheus_client.parser import text_string_to_metric_families

    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(
        name="together", model=str(demo_model), max_workers=1, target_concurrency=8
    )
    jobs = [client.submit("together", {"prompt": "Hi", "max_tokens": 3}) for _ in range(24)]
    done = [j.wait(timeout=120) for j in jobs]
    assert [j.status for j in done] == ["succeeded"] * 24
    assert all(j.output["text"] and j.raw["attempt"] == 1 for j in done)
    headers = {"Authorization": f"Bearer {platform['api_key']}"}
    groups = httpx.get(f"{platform['url']}/metrics/workers", headers=headers).json()
    (target,) = [g["targets"][0] for g in groups if g["labels"].get("deployment") == "together"]
    sent: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"http://{target}/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("platform_worker_control_") and sample.name.endswith(
                "_total"
            ):
                sent[(sample.name, sample.labels["call"])] = sample.value
    # A job that arrives while the worker has a free slot and nothing waits is handed to it at
    # admission (no claim): on a slow machine the burst's tail can come after the first jobs
    # ended. Every job is claimed or handed off.
    handed_off = 0.0
    scrape = httpx.get(f"{platform['url']}/metrics", headers=headers).text
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            ours = sample.labels.get("deployment") == "together"
            if sample.name == "platform_jobs_handed_off_total" and ours:
                handed_off += sample.value
    for call in ("claim", "report"):
        jobs_sent = sent[("platform_worker_control_jobs_total", call)]
        requests = sent[("platform_worker_control_requests_total", call)]
        expected = 24 - handed_off if call == "claim" else 24
        assert jobs_sent >= expected and requests <= jobs_sent, (call, handed_off, sent)
    requests = sum(v for (name, _), v in sent.items() if "_requests_" in name)
    jobs_sent = sum(v for (name, _), v in sent.items() if "_jobs_" in name)
    assert requests < jobs_sent, f"nothing went together: {sent}"
    client.deployments.delete("together")

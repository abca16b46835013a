"""The worker's own /metrics: a real model (the demo checkpoint, loaded by the real loader)
stepped by the real engine loop on a real Redis, scraped over HTTP on loopback and parsed with
prometheus_client's parser; the heartbeat naming the address. The start-up phase clock itself:
tests/unit/test_worker_metrics.py."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.messages import Assignment
from common.protocol import HEARTBEAT_METRICS_FIELD, WorkerState, worker_heartbeat_key
from worker.engine.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.params import SamplingParams
from worker.runtime.engine_loop import EngineLoop, Job, JobResult
from worker.runtime.lifecycle import WorkerRuntime
from worker.runtime.metrics import PhaseClock, WorkerMetrics
from worker.settings import WorkerSettings


def scrape(target: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """sample name and labels → value, from the worker's /metrics."""
    text = httpx.get(f"http://{target}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from worker.model.demo import create_demo_model

    return create_demo_model(tmp_path_factory.mktemp("demo"), seed=0, train_steps=0)


def test_engine_and_loader_families_after_real_jobs(demo_dir: Path, redis_client: Any) -> None:
    from worker.runtime.loading import load_model

    metrics = WorkerMetrics(started_at=time.monotonic())
    target = metrics.serve("127.0.0.1", 0)
    assert target is not None and target.startswith("127.0.0.1:")
    try:
        loaded = load_model(str(demo_dir), device="cpu")
        metrics.model_loaded(loaded.metrics)
        config = EngineConfig(block_size=16, max_num_seqs=4, kv_cache_bytes=4 << 20)
        engine = LLMEngine.from_model(loaded.model, loaded.tokenizer, (), config)
        metrics.engine = engine
        results: queue.SimpleQueue[tuple[Job, JobResult]] = queue.SimpleQueue()
        loop = EngineLoop(
            engine, redis_client, 0.05, lambda j, r: results.put((j, r)), observer=metrics
        )
        loop.start()
        # the same long prompt twice, one after the other: the second finds its full blocks
        # in the prefix cache
        prompt = engine.encode("The river ran past the mill and the old stone bridge, " * 3)
        prompt_tokens = 0
        for i, max_tokens in enumerate((6, 4)):
            deadline = time.monotonic() + 60
            loop.submit(Job(f"j{i}", 1, prompt, SamplingParams(max_tokens=max_tokens), deadline))
            prompt_tokens += len(prompt)
            _, result = results.get(timeout=60)
            assert result.status == "succeeded" and result.generated_tokens == max_tokens
        loop.stop(timeout_s=10)
        m = scrape(target)
    finally:
        metrics.close()

    def value(name: str, **labels: str) -> float:
        return m[(name, tuple(sorted(labels.items())))]

    # tokens, requests and their latency histograms
    assert value("platform_worker_prompt_tokens_total") == prompt_tokens
    assert value("platform_worker_generation_tokens_total") == 10
    assert value("platform_worker_requests_finished_total", finish_reason="length") == 2
    assert value("platform_worker_time_to_first_token_seconds_count") == 2
    assert value("platform_worker_inter_token_latency_seconds_count") == (6 - 1) + (4 - 1)
    assert value("platform_worker_inter_token_latency_seconds_bucket", le="+Inf") == 8
    assert value("platform_worker_request_latency_seconds_count") == 2
    assert value("platform_worker_time_to_first_token_seconds_sum") > 0
    # the engine's state, read at the scrape
    stats = engine.stats()
    assert value("platform_worker_kv_cache_blocks") == engine.cache.num_blocks
    assert value("platform_worker_kv_cache_usage_ratio") == stats.kv_cache_usage == 0.0
    assert value("platform_worker_requests_running") == value("platform_worker_requests_waiting")
    assert value("platform_worker_preemptions_total") == stats.num_preemptions
    queried = value("platform_worker_prefix_cache_query_tokens_total")
    hits = value("platform_worker_prefix_cache_hit_tokens_total")
    assert queried == prompt_tokens == stats.prefix_cache.queries
    assert 16 <= hits == stats.prefix_cache.hits  # at least one full block of the second
    assert value("platform_worker_prefix_cache_hit_ratio") == pytest.approx(hits / queried)
    # the weight load
    lm = loaded.metrics
    assert value("platform_worker_loaded_bytes_total") == lm.bytes_total > 0
    assert value("platform_worker_load_duration_seconds") == pytest.approx(lm.seconds)
    assert value("platform_worker_load_throughput_bytes_per_second") == pytest.approx(
        lm.bytes_total / lm.seconds
    )
    assert value("platform_worker_load_phase_seconds", phase="fetch") == pytest.approx(
        lm.phases_s["fetch"]
    )
    assert any(name == "process_resident_memory_bytes" for name, _ in m)


def test_the_heartbeat_names_the_metrics_address_and_phases_are_exported(
    redis_client: Any, redis_url: str
) -> None:
    settings = WorkerSettings(redis_url=redis_url, worker_metrics_port=0)
    rt = WorkerRuntime(settings, "wrk_metrics", "cpu", Assignment("dep_1", 1, "file:///m", "q", 1))
    rt.control = _NoControl()  # type: ignore[assignment]
    rt.metrics_target = rt.metrics.serve(settings.worker_metrics_host, 0)
    try:
        assert rt.metrics_target is not None
        rt.metrics._phases = PhaseClock(started_at=time.monotonic() - 2.0)
        rt._set_state(WorkerState.LOADING)
        beat = json.loads(redis_client.get(worker_heartbeat_key("wrk_metrics")))
        assert beat[HEARTBEAT_METRICS_FIELD] == rt.metrics_target
        m = scrape(rt.metrics_target)
        assert m[("platform_worker_cold_start_phase_seconds", (("phase", "boot"),))] >= 2.0
    finally:
        rt.metrics.close()
    # no port configured: no server, and nothing in the heartbeat
    quiet = WorkerRuntime(WorkerSettings(redis_url=redis_url), "wrk_quiet", "cpu")
    assert quiet.metrics.serve("127.0.0.1", None) is None
    quiet._beat()
    assert HEARTBEAT_METRICS_FIELD not in json.loads(
        redis_client.get(worker_heartbeat_key("wrk_quiet"))
    )


def test_a_taken_port_falls_back_to_a_free_one() -> None:
    first = WorkerMetrics(started_at=time.monotonic())
    second = WorkerMetrics(started_at=time.monotonic())
    taken = first.serve("127.0.0.1", 0)
    try:
        assert taken is not None
        other = second.serve("127.0.0.1", int(taken.rsplit(":", 1)[1]))
        assert other is not None and other != taken
        assert "platform_worker_prompt_tokens_total" in httpx.get(f"http://{other}/").text
    finally:
        first.close()
        second.close()


class _NoControl:
    def report_state(
        self, state: str, reason: str | None = None, *, takes_handoffs: bool = False
    ) -> None:
        pass

    def close(self) -> None:
        pass

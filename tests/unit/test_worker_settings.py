"""Engine and loader tuning through the environment: PLATFORM_ENGINE_* and PLATFORM_LOADER_*
reach local workers (and only those of the control plane's PLATFORM_* settings), are
validated, and size the engine and the weight loads. Workers reach Redis at
PLATFORM_WORKER_REDIS_URL when the operator gives them their own path."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from common.messages import Assignment
from control_plane.providers.local import worker_env
from control_plane.providers.select import workers_env
from control_plane.settings import Settings
from worker.runtime import engine_setup
from worker.settings import WorkerSettings


def test_engine_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().engine_overrides() == {}
    monkeypatch.setenv("PLATFORM_ENGINE_KV_CACHE_BYTES", str(64 << 20))
    monkeypatch.setenv("PLATFORM_ENGINE_MAX_NUM_BATCHED_TOKENS", "256")
    monkeypatch.setenv("PLATFORM_ENGINE_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("PLATFORM_ENGINE_ATTENTION_BACKEND", "torch")
    assert WorkerSettings().engine_overrides() == {
        "kv_cache_bytes": 64 << 20,
        "max_num_batched_tokens": 256,
        "enable_prefix_caching": False,
        "attention_backend": "torch",
    }


def test_loader_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    default = WorkerSettings().load_options()
    assert default.cache_dir is None and default.concurrency is None
    monkeypatch.setenv("PLATFORM_LOADER_CACHE_DIR", "/var/cache/weights")
    monkeypatch.setenv("PLATFORM_LOADER_CACHE_MAX_BYTES", str(10 << 30))
    monkeypatch.setenv("PLATFORM_LOADER_CONCURRENCY", "8")
    monkeypatch.setenv("PLATFORM_LOADER_RING_BYTES", str(256 << 20))
    options = WorkerSettings().load_options()
    assert (options.cache_dir, options.cache_max_bytes) == ("/var/cache/weights", 10 << 30)
    assert (options.concurrency, options.ring_bytes) == (8, 256 << 20)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PLATFORM_ENGINE_KV_CACHE_BYTES", "0"),
        ("PLATFORM_ENGINE_KV_CACHE_MEMORY_FRACTION", "1.5"),
        ("PLATFORM_ENGINE_ATTENTION_BACKEND", "cuda"),
        ("PLATFORM_ENGINE_BLOCK_SIZE", "sixteen"),
        ("PLATFORM_LOADER_CONCURRENCY", "0"),
        ("PLATFORM_LOADER_RING_BYTES", "4096"),
    ],
)
def test_bad_engine_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("PLATFORM_").lower()):
        WorkerSettings()


def test_worker_env_passes_engine_tuning_but_no_other_platform_setting() -> None:
    base = {
        "PATH": "/bin",
        "PLATFORM_DATABASE_URL": "postgresql://secret",
        "PLATFORM_ADMIN_KEY": "sk_admin",
        "PLATFORM_ENGINE_KV_CACHE_BYTES": "1024",
        "PLATFORM_LOADER_CACHE_DIR": "/var/cache/weights",
    }
    env = worker_env(base, {"PLATFORM_REDIS_URL": "redis://x"})
    assert env["PATH"] == "/bin"
    assert env["PLATFORM_ENGINE_KV_CACHE_BYTES"] == "1024"
    assert env["PLATFORM_LOADER_CACHE_DIR"] == "/var/cache/weights"
    assert env["PLATFORM_REDIS_URL"] == "redis://x"
    assert "PLATFORM_DATABASE_URL" not in env and "PLATFORM_ADMIN_KEY" not in env


def test_workers_reach_redis_where_the_operator_says() -> None:
    """PLATFORM_WORKER_REDIS_URL: the workers' own way to Redis (a node-local address); the
    setting itself is the control plane's and does not reach them."""
    base = {"PATH": "/bin", "PLATFORM_WORKER_REDIS_URL": "redis://node-local:6379/0"}
    shared = Settings(redis_url="redis://redis:6379/0", worker_token="t" * 16)
    assert workers_env(shared, base)["PLATFORM_REDIS_URL"] == "redis://redis:6379/0"

    own = Settings(
        redis_url="redis://redis:6379/0",
        worker_redis_url="redis://node-local:6379/0",
        worker_token="t" * 16,
        internal_url="http://cp:8000",
    )
    env = workers_env(own, base)
    assert env["PLATFORM_REDIS_URL"] == "redis://node-local:6379/0"
    assert env["PLATFORM_INTERNAL_URL"] == "http://cp:8000"
    assert env["PLATFORM_WORKER_TOKEN"] == "t" * 16
    assert "PLATFORM_WORKER_REDIS_URL" not in env


def test_the_worker_sizes_its_engine_from_the_settings(tmp_path: Path) -> None:
    from worker.model.demo import create_demo_model
    from worker.model.runner import kv_block_bytes
    from worker.model.weights import torch_dtype
    from worker.runtime.loading import load_model

    checkpoint = create_demo_model(tmp_path, seed=0, train_steps=0)
    loaded = dataclasses.replace(load_model(str(checkpoint)), max_context=128)
    config = loaded.model.config
    assignment = Assignment("dep_1", 1, "file:///m", "q", 3)

    def build(**settings: Any) -> Any:
        return engine_setup.build_engine(WorkerSettings(**settings), assignment, loaded)

    block_bytes = kv_block_bytes(config, 8, torch_dtype(config))
    engine = build(
        engine_kv_cache_bytes=10 * block_bytes + 1,
        engine_block_size=8,
        engine_max_num_batched_tokens=64,
    )
    assert engine.cache.num_blocks == 10
    assert engine.cache.block_size == 8
    assert engine.config.max_num_batched_tokens == 64
    assert engine.config.max_num_seqs == 3

    default = build()
    assert default.config.max_num_batched_tokens == 2048
    # default CPU cache: room for max_num_seqs sequences of the whole context
    assert default.cache.num_blocks == 3 * -(-128 // 16)

"""Settings of one worker process (env prefix `PLATFORM_`); identity comes from the command line."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from common.logs import LogSettings
from common.protocol import HOST_CACHE_DIR
from common.tracing import TraceSettings
from loader.options import LoadOptions


class WorkerSettings(LogSettings, TraceSettings):
    """A worker's settings; its log settings (PLATFORM_LOG_*) come with LogSettings, its trace
    settings (PLATFORM_OTEL_*) with TraceSettings."""

    model_config = SettingsConfigDict(env_prefix="PLATFORM_", frozen=True, extra="ignore")

    # Where the control plane's /internal endpoints are.
    internal_url: str = "http://127.0.0.1:8000"
    worker_token: SecretStr = SecretStr("")
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Torch intra-op threads (0: torch's default).
    worker_threads: int = Field(1, ge=0)
    # Seconds between cancel-flag checks while generating.
    cancel_poll_s: float = Field(0.2, gt=0)
    # Where this worker serves its Prometheus /metrics (set by its provider: loopback, or the
    # pod IP); port None: none served, 0: any free port. The heartbeat says where it is.
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int | None = Field(None, ge=0, le=65535)

    # --- engine tuning (PLATFORM_ENGINE_*; None: the engine's default) ---
    # Token budget of one engine step (prompt chunks + one token per decoding request).
    engine_max_num_batched_tokens: int | None = Field(None, ge=1)
    # KV-cache size in bytes (CPU default: room for every held job at full context, <= 2 GiB).
    engine_kv_cache_bytes: int | None = Field(None, ge=1)
    # On CUDA without an explicit size: share of the device memory free after loading weights.
    engine_kv_cache_memory_fraction: float | None = Field(None, gt=0, le=1)
    # Tokens per KV-cache block.
    engine_block_size: int | None = Field(None, ge=1)
    engine_enable_prefix_caching: bool | None = None
    engine_enable_chunked_prefill: bool | None = None
    # "triton" (CUDA only), "cpu" (a C kernel for decodes, float32), "torch" (the reference
    # path) or "auto" (triton on CUDA, cpu on CPU where it can run).
    engine_attention_backend: Literal["auto", "torch", "triton", "cpu"] | None = None

    # --- weight loading (PLATFORM_LOADER_*) ---
    # Local cache tier for weights (a node's disk): the next load of the same object version
    # reads it; None: off.
    loader_cache_dir: str | None = None
    # Size cap of the cache tier (LRU eviction beyond it).
    loader_cache_max_bytes: int = Field(100 << 30, ge=1)
    # Host-memory tier in front of the disk tier (entries outlive the worker: the next worker
    # on this host reads them at memory speed): its size cap; 0: off.
    loader_host_cache_bytes: int = Field(0, ge=0)
    # Where the host tier lives: a directory on a tmpfs.
    loader_host_cache_dir: str = HOST_CACHE_DIR
    # Concurrent ranged GETs (None: from the core count).
    loader_concurrency: int | None = Field(None, ge=1)
    # Expected link bandwidth in bytes/s (sizes the parts; see loader.LoadOptions).
    loader_bandwidth_bps: float = Field(1.25e10, gt=0)
    # Pinned staging ring for GPU loads: bounds the extra host memory (None: from the host's).
    loader_ring_bytes: int | None = Field(None, ge=1 << 20)

    def load_options(self) -> LoadOptions:
        return LoadOptions(
            concurrency=self.loader_concurrency,
            bandwidth_bps=self.loader_bandwidth_bps,
            ring_bytes=self.loader_ring_bytes,
            cache_dir=self.loader_cache_dir,
            cache_max_bytes=self.loader_cache_max_bytes,
            host_cache_dir=self.loader_host_cache_dir if self.loader_host_cache_bytes else None,
            host_cache_max_bytes=self.loader_host_cache_bytes,
        )

    def engine_overrides(self) -> dict[str, object]:
        """The engine settings given in the environment, as `EngineConfig` keyword arguments."""
        prefix = "engine_"
        return {
            name[len(prefix) :]: value
            for name, value in self.model_dump().items()
            if name.startswith(prefix) and value is not None
        }

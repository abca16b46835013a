"""Engine settings (what the operator chooses) and the cache shape derived from them.

Pure Python. ``EngineConfig`` is validated on construction and never mutated; values derived
at start-up from the model and the device (number of KV blocks, context limit) live in
``CacheSpec`` (STYLE 4).

Example:

    >>> config = EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024)
    >>> EngineConfig(block_size=0)
    Traceback (most recent call last):
    ValueError: block_size: must be >= 1, got 0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AttentionBackend = Literal["auto", "torch", "triton", "cpu"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine batches and how much KV cache it keeps."""

    # most requests running at once (a step computes at most this many sequences)
    max_num_seqs: int = 64
    # token budget of one step: prompt chunks + one token per decoding request
    max_num_batched_tokens: int = 2048
    # context limit (prompt + generated); None = the model's max_position_embeddings
    max_model_len: int | None = None
    # tokens per KV-cache block
    block_size: int = 16
    # reuse the keys/values of prompt prefixes seen before (full blocks only)
    enable_prefix_caching: bool = True
    # split long prompts across steps, mixed with decodes; off: a prompt is one step
    enable_chunked_prefill: bool = True
    # KV-cache size in blocks; overrides everything below (tests, benchmarks)
    num_kv_blocks: int | None = None
    # KV-cache size in bytes (required knob on CPU; None = room for max_num_seqs sequences of
    # max_model_len tokens, at most DEFAULT_CPU_KV_CACHE_BYTES)
    kv_cache_bytes: int | None = None
    # on CUDA with no explicit size: this share of the device memory free after loading weights
    kv_cache_memory_fraction: float = 0.8
    # "triton" kernels (CUDA only), "cpu" (torch for prompts, a C kernel for decodes: float32
    # on CPU, needs a C compiler), the "torch" reference, or "auto" (triton on CUDA, cpu on
    # CPU where it can run, torch otherwise)
    attention_backend: AttentionBackend = "auto"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            _check_positive(name, getattr(self, name))
        for name in ("max_model_len", "num_kv_blocks", "kv_cache_bytes"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if not 0 < self.kv_cache_memory_fraction <= 1:
            raise ValueError(
                "kv_cache_memory_fraction: must be in (0, 1], "
                f"got {self.kv_cache_memory_fraction!r}"
            )
        if self.attention_backend not in ("auto", "torch", "triton", "cpu"):
            raise ValueError(
                "attention_backend: must be 'auto', 'torch', 'triton' or 'cpu', "
                f"got {self.attention_backend!r}"
            )


# CPU default ceiling for the KV cache when no size is given.
DEFAULT_CPU_KV_CACHE_BYTES = 2 * 1024**3


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """Derived at start-up from the config, the model and the device."""

    # KV-cache blocks available to sequences
    num_blocks: int
    # tokens per block (EngineConfig.block_size)
    block_size: int
    # longest sequence (prompt + generated) accepted
    max_model_len: int
    # keys every layer's query sees, when *every* layer has a sliding window (blocks before
    # it are freed as sequences advance); None when some layer attends to the whole sequence
    sliding_window: int | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens the whole cache holds."""
        return self.num_blocks * self.block_size


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name}: must be >= 1, got {value}")

"""The loader's contracts with its callers: options in; progress, metrics and placement hooks.

>>> from loader import LoadOptions, load
>>> result = load("s3://models/llama/", device="cuda", options=LoadOptions(ring_bytes=256 << 20))
>>> result.metrics.gbps
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class S3Options:
    endpoint_url: str | None = None  # None: AWS_ENDPOINT_URL(_S3) or AWS itself
    region: str | None = None  # None: AWS_REGION / AWS_DEFAULT_REGION or us-east-1
    profile: str | None = None  # None: AWS_PROFILE or the default credential chain


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to fetch. Every default is derived or safe; tests shrink the timeouts."""

    concurrency: int | None = None  # concurrent ranged GETs; None: from the core count
    part_bytes: int | None = None  # bytes per ranged GET; None: from concurrency and bandwidth
    # Expected link bandwidth, bytes/s: sizes the parts. GPU hosts have 100 Gbps and more; at
    # 10 Gbps the parts of 16 connections were 2 MiB and an 8B checkpoint loaded to an H100 at
    # 1.8 GB/s where 16 MiB parts reached 6.6 GB/s (docs/benchmarks.md).
    bandwidth_bps: float = 1.25e10
    first_request_bytes: int = 1 * MiB  # speculative first GET: header + first data bytes
    # Pinned staging ring (device loads only): bounds the extra host RAM. None: 1/32 of the
    # host's memory within [64 MiB, 1 GiB]; the ring caps the part size at ring / (2 × conns).
    ring_bytes: int | None = None
    max_retries: int = 5  # retries of one part before FetchError
    backoff_s: float = 0.05  # first retry delay; doubles, with jitter, up to max_backoff_s
    max_backoff_s: float = 2.0  # cap of the retry delay
    timeout_s: float = 30.0  # per-request timeout until part times have been observed
    min_part_timeout_s: float = 5.0  # floor of the timeout derived from observed part times
    slowdown_factor: float = 8.0  # a part slower than this × the median part time is retried
    # Cache tiers are read by a load and filled afterwards by `LoadResult.fill_tiers()`.
    cache_dir: str | None = None  # local disk cache tier; None: off
    cache_max_bytes: int = 100 << 30  # size cap of the cache tier; LRU eviction beyond it
    # Host-memory tier in front of the disk tier: a directory on a tmpfs (e.g. under /dev/shm),
    # so an entry outlives the worker that loaded it; a hit on CPU maps it (no copy). None: off.
    host_cache_dir: str | None = None
    host_cache_max_bytes: int = 0  # its size cap (LRU beyond it); 0: off
    # Concurrent reads of a tier fill (each with one part buffer: the fill's extra memory);
    # few, so that a fill running beside a serving model does not starve it.
    fill_concurrency: int = 2
    # A tier fill downloads hf:// objects with hf_transfer when it is installed (a load
    # itself always streams them with the loader's own ranged GETs).
    hf_transfer: bool = True
    s3: S3Options = field(default_factory=S3Options)  # S3 endpoint and credentials

    def resolved_ring_bytes(self) -> int:
        if self.ring_bytes:
            return self.ring_bytes
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (OSError, ValueError):
            memory = 0
        return min(1 << 30, max(64 * MiB, memory // 32))

    def resolved_concurrency(self) -> int:
        if self.concurrency:
            return max(1, self.concurrency)
        # Ranged GETs are I/O-bound: a few per core hide request latency; past 16 the server
        # and the NIC, not the client, are the limit.
        return min(16, max(4, 2 * (os.cpu_count() or 1)))


@dataclass(frozen=True, slots=True)
class Fused:
    """Place this tensor as member `index` of `target`, concatenated along dim 0.

    Members of one target are laid out next to each other in the arena as they arrive, so the
    fused tensor costs no copy (e.g. q/k/v projections → one qkv weight). All members must have
    the same dtype and the same trailing dims.
    """

    target: str  # name of the fused tensor in the result
    index: int  # position along dim 0, 0-based; members are ordered by it


# name in the checkpoint → new name, a Fused placement, or None to skip the tensor (not fetched)
NameMap = Callable[[str], "str | Fused | None"]
TensorCallback = Callable[[str, "torch.Tensor"], None]


@dataclass(frozen=True, slots=True)
class Progress:
    uri: str  # what is being loaded
    phase: str  # "header" | "fetch" | "done"
    bytes_done: int  # data bytes landed in their destination (or mapped)
    bytes_total: int  # data bytes to land
    tensors_ready: int  # result tensors complete
    tensors_total: int  # result tensors expected
    elapsed_s: float  # since the load started


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True, slots=True)
class LoadMetrics:
    """What one load did; `phases_s` keys: header, fetch, copy (device copy wait), finish."""

    uri: str  # what was loaded
    bytes_total: int  # data bytes loaded: fetched, or mapped (headers excluded)
    seconds: float  # wall time of the whole load
    phases_s: dict[str, float]  # seconds per phase
    num_objects: int  # safetensors objects (shards)
    num_parts: int  # ranged reads issued (first attempts)
    num_retries: int  # part retries after errors or timeouts
    concurrency: int  # concurrent ranged reads
    part_bytes: int  # bytes per ranged read
    cache_hits: int  # objects read from a cache tier (any)
    device: str  # where the tensors are
    tier_hits: dict[str, int] = field(default_factory=dict)  # cache hits per tier (host, disk)
    mapped_bytes: int = 0  # of bytes_total, views of mapped host-tier entries (not copied)

    @property
    def gbps(self) -> float:
        return self.bytes_total / self.seconds / 1e9 if self.seconds > 0 else 0.0

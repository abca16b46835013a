"""The header phase: one speculative ranged GET per object for its header and first data bytes,
served from the local cache tier when it holds the object (or when hf_transfer can fill it).

NOTE: every later read of an object goes to `ObjectHead.source` and is pinned to
`ObjectHead.info`, so a load reads one version of each object, from one place.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from loader.cache import DiskCache, Tier
from loader.errors import FetchError
from loader.header import HEADER_PREFIX_BYTES, Header, header_length, parse_header
from loader.hf import HfSource, hf_transfer_installed
from loader.http import ObjectInfo, Retryable
from loader.options import LoadOptions
from loader.plan import ShardHeader, derive_part_bytes
from loader.sources import LocalSource, Source, open_source


@dataclass(frozen=True, slots=True)
class ObjectHead:
    """What the header phase learnt about one object."""

    source: Source  # where the data comes from (the cache entry after a hit or a fill)
    info: ObjectInfo  # version pinned for every later read
    header: Header  # parsed header
    raw: bytes  # the 8-byte prefix + header bytes (written to the cache)
    prefetched: bytearray  # data bytes that came with the header
    stream: bool  # the server ignores Range: read the object as one stream
    downloaded_s: float = -1.0  # seconds hf_transfer took to fill the cache entry (-1: not used)
    tier: str | None = None  # the cache tier the bytes come from (a hit or an hf_transfer fill)
    origin: ObjectInfo | None = None  # the origin's version when `tier` serves it (its key)

    @property
    def cache_hit(self) -> bool:
        """Served from a cache tier that already held it (not filled by this load)."""
        return self.tier is not None and self.downloaded_s < 0

    @property
    def version(self) -> ObjectInfo:
        """The object's version at its origin: what cache tiers key its entries on."""
        return self.origin or self.info

    def shard(self) -> ShardHeader:
        """The planner's view of the object."""
        prefetched_end = self.header.data_offset + len(self.prefetched)
        return ShardHeader(self.source.uri, self.info.size, self.header, prefetched_end)


def read_heads(
    uris: Sequence[str], options: LoadOptions, tiers: Sequence[Tier], concurrency: int
) -> tuple[ObjectHead, ...]:
    """Heads of every object, read concurrently; the first error is raised."""
    use_hf_transfer = bool(tiers) and options.hf_transfer and hf_transfer_installed()

    def head(uri: str) -> ObjectHead:
        return _read_object_head(uri, options, tiers, concurrency, use_hf_transfer)

    with ThreadPoolExecutor(max_workers=min(concurrency, len(uris))) as pool:
        return tuple(pool.map(head, uris))


def close_sources(heads: Sequence[ObjectHead]) -> None:
    """Release what the sources hold open (file descriptors of local files)."""
    for h in heads:
        close = getattr(h.source, "close", None)
        if close is not None:
            close()


def _read_object_head(
    uri: str,
    options: LoadOptions,
    tiers: Sequence[Tier],
    concurrency: int,
    use_hf_transfer: bool,
) -> ObjectHead:
    source = open_source(uri, options.s3)
    head = read_head(source, options)
    if not tiers or not source.remote:
        return head
    # NOTE: the origin's header read gives the version (ETag, size) every tier is keyed on.
    for tier in tiers:
        hit = tier.cache.lookup(uri, head.info)
        if hit is not None:
            local = read_head(LocalSource(uri, hit), options)
            return dataclasses.replace(local, origin=head.info, tier=tier.name)
    if use_hf_transfer and isinstance(source, HfSource):
        slowest = tiers[-1]  # the largest: the Hub's files go where they last longest
        t0 = time.monotonic()
        filled = _hf_transfer_fill(slowest.cache, source, head.info, concurrency, options)
        if filled is not None:
            downloaded_s = time.monotonic() - t0
            local = read_head(LocalSource(uri, filled), options)
            return dataclasses.replace(
                local, origin=head.info, downloaded_s=downloaded_s, tier=slowest.name
            )
    return head


def read_head(source: Source, options: LoadOptions) -> ObjectHead:
    """One ranged GET for the header and the first data bytes (two if the header is larger)."""
    for attempt in range(options.max_retries + 1):
        try:
            return _read_head_once(source, options)
        except Retryable as exc:
            if attempt == options.max_retries:
                raise FetchError(
                    source.uri, f"reading the header failed {attempt + 1} times (last: {exc})"
                ) from exc
            time.sleep(min(options.max_backoff_s, options.backoff_s * 2**attempt))
    raise AssertionError("unreachable")


def _read_head_once(source: Source, options: LoadOptions) -> ObjectHead:
    info, body = source.open_range(0, options.first_request_bytes, None, options.timeout_s)
    try:
        stream = getattr(body, "whole", False)
        prefix = bytearray(HEADER_PREFIX_BYTES)
        if body.end < HEADER_PREFIX_BYTES:
            header_length(source.uri, b"", info.size)  # raises: too small
        body.readinto(memoryview(prefix))
        n = header_length(source.uri, prefix, info.size)
        raw = bytearray(HEADER_PREFIX_BYTES + n)
        raw[:HEADER_PREFIX_BYTES] = prefix
        view = memoryview(raw)
        here = min(len(raw), body.end)
        body.readinto(view[HEADER_PREFIX_BYTES:here])
        prefetched = bytearray(max(0, body.end - len(raw)))
        if prefetched:
            body.readinto(memoryview(prefetched))
    finally:
        body.close()
    if here < len(raw):  # the header is longer than the speculative read
        _, rest = source.open_range(here, len(raw), info, options.timeout_s)
        try:
            rest.readinto(view[here:])
        finally:
            rest.close()
    header = parse_header(source.uri, view[HEADER_PREFIX_BYTES:], info.size)
    return ObjectHead(source, info, header, bytes(raw), prefetched, stream)


def _hf_transfer_fill(
    cache: DiskCache, source: HfSource, info: ObjectInfo, concurrency: int, options: LoadOptions
) -> Path | None:
    """Download a Hub file into a new cache entry with hf_transfer; None if it cannot fit."""
    part = options.part_bytes or derive_part_bytes(
        info.size, concurrency, options.bandwidth_bps, None
    )
    return cache.fill(
        source.uri,
        info,
        lambda tmp: source.download(tmp, concurrency, part, options.max_retries),
    )

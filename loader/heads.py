"""The header phase: one speculative ranged GET per object for its header and first data bytes,
served from the fastest cache tier holding the object's version when one does.

NOTE: every later read of an object goes to `ObjectHead.source` and is pinned to
`ObjectHead.info`, so a load reads one version of each object, from one place.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from loader.cache import Tier
from loader.errors import FetchError, ObjectNotFound
from loader.header import HEADER_PREFIX_BYTES, Header, header_length, parse_header
from loader.http import ObjectInfo, Retryable
from loader.options import LoadOptions
from loader.plan import ShardHeader
from loader.sources import LocalSource, ObjectStore, Source


@dataclass(frozen=True, slots=True)
class ObjectHead:
    """What the header phase learnt about one object."""

    source: Source  # where the data comes from (the cache entry after a hit)
    info: ObjectInfo  # version pinned for every later read
    header: Header  # parsed header
    raw: bytes  # the 8-byte prefix + header bytes (a cache fill checks its entry against them)
    prefetched: bytearray  # data bytes that came with the header
    stream: bool  # the server ignores Range: read the object as one stream
    tier: str | None = None  # the cache tier the bytes come from (a hit); None: the origin
    origin: ObjectInfo | None = None  # the origin's version when `tier` serves it (its key)

    @property
    def cache_hit(self) -> bool:
        """Served from a cache tier."""
        return self.tier is not None

    @property
    def version(self) -> ObjectInfo:
        """The object's version at its origin: what cache tiers key its entries on."""
        return self.origin or self.info

    def shard(self) -> ShardHeader:
        """The planner's view of the object."""
        prefetched_end = self.header.data_offset + len(self.prefetched)
        return ShardHeader(self.source.uri, self.info.size, self.header, prefetched_end)


def read_heads(
    uris: Sequence[str],
    options: LoadOptions,
    tiers: Sequence[Tier],
    concurrency: int,
    store: ObjectStore,
) -> tuple[ObjectHead, ...]:
    """Heads of every object, read concurrently; the first error is raised."""

    def head(uri: str) -> ObjectHead:
        return _read_object_head(store.open(uri), options, tiers)

    with ThreadPoolExecutor(max_workers=min(concurrency, len(uris))) as pool:
        return tuple(pool.map(head, uris))


def close_sources(heads: Sequence[ObjectHead]) -> None:
    """Release what the sources hold open (file descriptors of local files)."""
    for h in heads:
        close = getattr(h.source, "close", None)
        if close is not None:
            close()


def _read_object_head(source: Source, options: LoadOptions, tiers: Sequence[Tier]) -> ObjectHead:
    uri = source.uri
    head = read_head(source, options)
    if not tiers or not source.remote:
        return head
    # NOTE: the origin's header read gives the version (ETag, size) every tier is keyed on.
    for tier in tiers:
        hit = tier.cache.lookup(uri, head.info)
        if hit is None:
            continue
        try:
            entry = LocalSource(uri, hit, entry=True)
        except ObjectNotFound:
            continue  # evicted since the lookup
        local = read_head(entry, options)
        return dataclasses.replace(local, origin=head.info, tier=tier.name)
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

"""Load safetensors objects (one file, a sharded index, or a model directory) into one arena.

Phases: resolve (which objects), header (one speculative ranged GET per object: its header
and its first data bytes), plan (pure: `loader.plan`), fetch (`loader.fetch` into a sink),
finish (device copies, cache commit). Tensors are handed to `on_tensor` as soon as every byte
of theirs has landed; the result is returned only when all of them have.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loader.cache import CacheWriter, DiskCache
from loader.errors import CorruptCheckpoint, FetchError, LoaderError, ObjectNotFound
from loader.fetch import Fetcher, Task
from loader.header import DTYPES, HEADER_PREFIX_BYTES, Header, header_length, parse_header
from loader.hf import HfSource, hf_transfer_installed
from loader.http import ObjectInfo, Retryable
from loader.options import (
    LoadMetrics,
    LoadOptions,
    NameMap,
    Progress,
    ProgressCallback,
    TensorCallback,
)
from loader.plan import Placement, Plan, ShardHeader, derive_part_bytes, plan_load
from loader.sinks import Copier, CudaCopier, HostSink, Sink, StagedSink
from loader.sources import LocalSource, Source, exists, is_local, join_uri, local_path, open_source

if TYPE_CHECKING:
    import torch

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass
class LoadResult:
    tensors: dict[str, torch.Tensor]  # result name → tensor on the target device
    metrics: LoadMetrics  # what the load did
    metadata: list[dict[str, str]] = field(default_factory=list)  # `__metadata__` per object


@dataclass
class _Head:
    source: Source  # where the data comes from (a cache entry after a hit)
    info: ObjectInfo  # version pinned for every later read
    header: Header  # parsed header
    raw: bytes  # the 8-byte prefix + header bytes (written to the cache)
    prefetched: bytearray  # data bytes that came with the header
    stream: bool  # the server ignores Range: read the object as one stream
    cache_hit: bool  # served from the local cache tier
    downloaded_s: float = -1.0  # seconds hf_transfer took to fill the cache entry (-1: not used)


def resolve_objects(uri: str, options: LoadOptions) -> tuple[list[str], str | None, set[str]]:
    """(object URIs, index URI or None, tensor names the index promises)."""
    if uri.endswith(".safetensors") or (is_local(uri) and local_path(uri).is_file()):
        return [uri], None, set()
    index_uri = uri if uri.endswith(".json") else join_uri(uri, INDEX_NAME)
    if uri.endswith(".json") or exists(index_uri, options.s3):
        try:
            weight_map = json.loads(open_source(index_uri, options.s3).read_all())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptCheckpoint(index_uri, f"unreadable shard index: {exc!r}") from exc
        base = index_uri.rsplit("/", 1)[0]
        return [join_uri(base, s) for s in shards], index_uri, set(weight_map)
    single = join_uri(uri, SINGLE_NAME)
    if exists(single, options.s3):
        return [single], None, set()
    names = _list_dir(uri, options)
    found = [n for n in names if n.endswith(".safetensors")]
    if found:
        return [join_uri(uri, n) for n in found], None, set()
    shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "") if names else "nothing"
    raise ObjectNotFound(
        single,
        f"no {SINGLE_NAME}, {INDEX_NAME} or *.safetensors under {uri} (found: {shown}); "
        "check the URI and that the upload finished",
    )


def _list_dir(uri: str, options: LoadOptions) -> list[str]:
    if is_local(uri):
        path = local_path(uri)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    try:
        return open_source(join_uri(uri, "probe"), options.s3).list_names()
    except LoaderError:
        return []


def _read_head(source: Source, options: LoadOptions) -> _Head:
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


def _read_head_once(source: Source, options: LoadOptions) -> _Head:
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
    return _Head(source, info, header, bytes(raw), prefetched, stream, False)


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


def _placement_tensor(arena: torch.Tensor, p: Placement, dtype: torch.dtype | None) -> torch.Tensor:
    import torch

    tdtype = getattr(torch, DTYPES[p.dtype][0])
    # Views of uint8 storage need offsets that suit the dtype; the plan guarantees it.
    t = arena[p.arena_offset : p.arena_offset + p.size_bytes].view(tdtype).view(p.shape)
    if dtype is not None and t.is_floating_point() and t.dtype != dtype:
        t = t.to(dtype)  # on the arena's device
    return t


def load(
    uri: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    name_map: NameMap | None = None,
    on_tensor: TensorCallback | None = None,
    on_progress: ProgressCallback | None = None,
    options: LoadOptions | None = None,
    copier: Copier | None = None,
) -> LoadResult:
    """Load a safetensors file, shard index or model directory onto `device`.

    `dtype` converts floating tensors (on the device). `name_map` renames, skips or fuses
    tensors (see `loader.Fused`). `on_tensor(name, tensor)` is called, in this thread, for
    each result tensor as soon as it is complete; if the load then fails, the error is raised
    and those tensors must be discarded. `copier` (tests) forces the staged path.
    """
    import torch

    options = options or LoadOptions()
    t_start = time.monotonic()
    dev = torch.device(device)
    uris, index_uri, promised = resolve_objects(uri, options)
    concurrency = options.resolved_concurrency()
    cache = DiskCache(options.cache_dir, options.cache_max_bytes) if options.cache_dir else None

    use_hf_transfer = cache is not None and options.hf_transfer and hf_transfer_installed()

    def head(u: str) -> _Head:
        source = open_source(u, options.s3)
        h = _read_head(source, options)
        if cache is not None and source.remote:
            hit = cache.lookup(u, h.info)
            if hit is not None:
                h = _read_head(LocalSource(u, hit), options)
                h.cache_hit = True
            elif use_hf_transfer and isinstance(source, HfSource):
                t0 = time.monotonic()
                hit = _hf_transfer_fill(cache, source, h.info, concurrency, options)
                if hit is not None:
                    downloaded_s = time.monotonic() - t0
                    h = _read_head(LocalSource(u, hit), options)
                    h.downloaded_s = downloaded_s
        return h

    with ThreadPoolExecutor(max_workers=min(concurrency, len(uris))) as pool:
        heads = list(pool.map(head, uris))
    if index_uri is not None:
        stored = {e.name for h in heads for e in h.header.entries}
        missing = sorted(promised - stored)
        if missing:
            raise CorruptCheckpoint(
                index_uri,
                f"{len(missing)} tensors named in the index are in no shard "
                f"(first: {', '.join(missing[:3])})",
            )
    t_header = time.monotonic()

    staged = copier is not None or dev.type != "cpu"
    total_data = sum(h.header.data_size for h in heads)
    slot_cap = max(1 << 20, options.ring_bytes // (2 * concurrency)) if staged else None
    part_bytes = options.part_bytes or derive_part_bytes(
        total_data, concurrency, options.bandwidth_bps, slot_cap
    )
    shards = [
        ShardHeader(u, h.info.size, h.header, h.header.data_offset + len(h.prefetched))
        for u, h in zip(uris, heads, strict=True)
    ]
    plan = plan_load(shards, part_bytes, name_map)

    writers: dict[int, CacheWriter] = {}
    if cache is not None and plan.complete:
        for i, h in enumerate(heads):
            if h.source.remote and not h.cache_hit:
                w = cache.writer(uris[i], h.info)
                if w is not None:
                    w.write(0, h.raw)
                    writers[i] = w

    tensors: dict[str, torch.Tensor] = {}
    remaining = list(plan.tensor_parts)
    done_bytes = 0
    fetcher: Fetcher | None = None

    def finish_tensor(i: int, arena: torch.Tensor) -> None:
        p = plan.placements[i]
        t = _placement_tensor(arena, p, dtype)
        tensors[p.name] = t
        if on_tensor is not None:
            on_tensor(p.name, t)

    def progress(phase: str) -> None:
        if on_progress is not None:
            on_progress(
                Progress(
                    uri,
                    phase,
                    done_bytes,
                    plan.fetch_bytes,
                    len(tensors),
                    len(plan.placements),
                    time.monotonic() - t_start,
                )
            )

    progress("header")
    sink: Sink | None = None
    staged_sink: StagedSink | None = None
    try:
        arena = torch.empty(plan.arena_bytes, dtype=torch.uint8, device=dev)
        for i, n in enumerate(remaining):
            if n == 0:
                finish_tensor(i, arena)

        fetcher = Fetcher(
            [h.source for h in heads],
            [h.info for h in heads],
            {i: (h.header.data_offset, memoryview(h.prefetched)) for i, h in enumerate(heads)},
            HostSink(arena, lambda p: None),  # replaced below; needs the fetcher's callback
            options,
            writers,
        )
        if staged:
            slot_bytes = max(
                part_bytes, max((p.size_bytes for p in plan.parts if p.prefetched), default=0)
            )
            num_slots = max(2, options.ring_bytes // slot_bytes)
            pin = dev.type == "cuda"
            slots = [
                torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=pin) for _ in range(num_slots)
            ]
            sink = staged_sink = StagedSink(arena, slots, copier or CudaCopier(dev), fetcher.landed)
        else:
            sink = HostSink(arena, fetcher.landed)
        fetcher.sink = sink

        def on_landed(part_index: int) -> None:
            nonlocal done_bytes
            part = plan.parts[part_index]
            done_bytes += part.size_bytes
            for i in plan.part_tensors[part_index]:
                remaining[i] -= 1
                if remaining[i] == 0:
                    finish_tensor(i, arena)
            progress("fetch")

        tasks = _tasks(plan, [h.stream for h in heads])
        fetcher.run(tasks, len(plan.parts), lambda p: on_landed(p.index), concurrency)
        t_fetch = time.monotonic()
        sink.close()
        sink = None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        for w in writers.values():
            w.commit()
        writers.clear()
    except BaseException:
        if fetcher is not None:
            fetcher.cancelled.set()
        if sink is not None:
            sink.close()
        for w in writers.values():
            w.abort()
        raise
    finally:
        for h in heads:
            close = getattr(h.source, "close", None)
            if close is not None:
                close()
    assert len(tensors) == len(plan.placements), "every placement is finished exactly once"
    t_end = time.monotonic()
    progress("done")
    copy_s = staged_sink.copy_wait_s if staged_sink is not None else 0.0
    phases = {
        "header": t_header - t_start,
        "fetch": t_fetch - t_header,
        "copy": copy_s,
        "finish": t_end - t_fetch,
    }
    downloads = [h.downloaded_s for h in heads if h.downloaded_s >= 0]
    if downloads:
        # hf_transfer filling cache entries in parallel; part of "header" (heads wait for it)
        phases["download"] = max(downloads)
    metrics = LoadMetrics(
        uri=uri,
        bytes_total=plan.fetch_bytes,
        seconds=t_end - t_start,
        phases_s=phases,
        num_objects=len(heads),
        num_parts=len(plan.parts),
        num_retries=fetcher.stats.retries,
        concurrency=concurrency,
        part_bytes=part_bytes,
        cache_hits=sum(h.cache_hit for h in heads),
        device=str(dev),
        hf_transfer_objects=sum(h.downloaded_s >= 0 for h in heads),
    )
    return LoadResult(tensors, metrics, [h.header.metadata for h in heads])


def _tasks(plan: Plan, stream: list[bool]) -> list[Task]:
    """Prefetched parts first (no I/O), then by object and offset; one task per stream."""
    first = [Task([p], False) for p in plan.parts if p.prefetched]
    rest: list[Task] = []
    streams: dict[int, Task] = {}
    for p in plan.parts:
        if p.prefetched:
            continue
        if stream[p.shard]:
            if p.shard not in streams:
                streams[p.shard] = Task([], True)
                rest.append(streams[p.shard])
            streams[p.shard].parts.append(p)
        else:
            rest.append(Task([p], False))
    return first + rest

"""Load safetensors objects (one file, a sharded index, or a model directory) into one arena.

`load` runs the phases in order; each builds its output only once its inputs exist:

    resolve   loader.objects   URI → CheckpointObjects (which objects; the index's promise)
    header    loader.heads     one speculative ranged GET per object (header + first data
                               bytes), through the cache tier (hit, or hf_transfer fill)
    plan      loader.phases    pure: check_index (loader.objects: the index's promise is
                               kept), plan_fetch → FetchLayout (loader.plan: the arena)
    allocate  loader.arena     the arena on the device and its sink (host, or pinned ring)
    fetch     loader.fetch     concurrent ranged reads into the sink; `Assembly` says which
                               tensors are complete as parts land
    finish                     sink closed, device synchronised, cache entries committed,
                               `load_metrics`

Tensors are handed to `on_tensor` as soon as every byte of theirs has landed; the result is
returned only when all of them have. A load that raises returns nothing: its sink is closed,
its new cache entries are removed and its sources are closed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loader.arena import allocate_arena, open_sink, tensor_view
from loader.cache import EntryWriter, FanOutWriter, Tier, cache_tiers
from loader.fetch import Fetcher
from loader.heads import ObjectHead, close_sources, read_heads
from loader.objects import check_index, resolve_objects
from loader.options import (
    LoadMetrics,
    LoadOptions,
    NameMap,
    ProgressCallback,
    TensorCallback,
)
from loader.phases import Assembly, FetchLayout, PhaseTimes, load_metrics, plan_fetch
from loader.plan import Part, Plan
from loader.sinks import Copier

if TYPE_CHECKING:
    import torch


@dataclass
class LoadResult:
    tensors: dict[str, torch.Tensor]  # result name → tensor on the target device
    metrics: LoadMetrics  # what the load did
    metadata: list[dict[str, str]] = field(default_factory=list)  # `__metadata__` per object


@dataclass(frozen=True, slots=True)
class _Delivery:
    """How result tensors and progress reach the caller."""

    dtype: torch.dtype | None  # floating tensors are converted to it; None: as stored
    on_tensor: TensorCallback | None  # gets each tensor as soon as it is complete
    on_progress: ProgressCallback | None  # after the headers, after each part, at the end
    started_at: float  # monotonic time the load began (progress reports elapsed time)

    def report(self, assembly: Assembly, phase: str) -> None:
        if self.on_progress is not None:
            self.on_progress(assembly.progress(phase, time.monotonic() - self.started_at))


@dataclass(frozen=True, slots=True)
class _Fetched:
    tensors: dict[str, torch.Tensor]  # result name → tensor on the target device
    fetched_at: float  # monotonic time when every part had landed
    num_retries: int  # part retries after errors or timeouts
    copy_wait_s: float  # seconds spent waiting for the staging ring's device copies


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
    delivery = _Delivery(dtype, on_tensor, on_progress, t_start)
    concurrency = options.resolved_concurrency()
    objects = resolve_objects(uri, options)
    tiers = cache_tiers(options)
    heads = read_heads(objects.uris, options, tiers, concurrency)
    try:
        check_index(objects, (h.header for h in heads))
        t_header = time.monotonic()
        layout = plan_fetch(
            [h.shard() for h in heads],
            [h.stream for h in heads],
            options,
            concurrency,
            staged=copier is not None or dev.type != "cpu",
            name_map=name_map,
        )
        assembly = Assembly(uri, layout.plan)
        delivery.report(assembly, "header")
        with _write_through(tiers, heads, layout.plan) as writers:
            fetched = _fetch(
                heads, layout, assembly, writers, delivery, dev, copier, options, concurrency
            )
    finally:
        close_sources(heads)
    assert assembly.complete, "every placement is finished exactly once"
    times = PhaseTimes(t_start, t_header, fetched.fetched_at, time.monotonic())
    delivery.report(assembly, "done")
    metrics = load_metrics(
        uri,
        times,
        heads,
        layout,
        concurrency=concurrency,
        num_retries=fetched.num_retries,
        copy_wait_s=fetched.copy_wait_s,
        device=str(dev),
    )
    return LoadResult(fetched.tensors, metrics, [h.header.metadata for h in heads])


@contextmanager
def _write_through(
    tiers: Sequence[Tier], heads: Sequence[ObjectHead], plan: Plan
) -> Iterator[dict[int, EntryWriter]]:
    """New cache entries (object index → writer) in every tier faster than the one an object
    comes from (all tiers for one from its origin), committed when the block succeeds and
    removed when it raises. Objects that are local files to begin with are not copied.

    Only a load that fetches every byte writes through: skipped tensors would leave holes.
    """
    writers: dict[int, EntryWriter] = {}
    names = [t.name for t in tiers]
    try:
        for i, h in enumerate(heads):
            if not plan.complete or not (h.source.remote or h.tier is not None):
                continue
            faster = tiers if h.tier is None else tiers[: names.index(h.tier)]
            fan_out = FanOutWriter([])
            writers[i] = fan_out  # before any entry exists: an error aborts them all
            for t in faster:
                entry = t.cache.writer(h.source.uri, h.version)
                if entry is not None:
                    fan_out.writers.append(entry)
                    entry.write(0, h.raw)
            if not fan_out.writers:
                del writers[i]
        yield writers
        while writers:
            writers.popitem()[1].commit()  # a committed entry is never aborted
    except BaseException:
        for w in writers.values():
            w.abort()
        raise


def _fetch(
    heads: Sequence[ObjectHead],
    layout: FetchLayout,
    assembly: Assembly,
    writers: dict[int, EntryWriter],
    delivery: _Delivery,
    device: torch.device,
    copier: Copier | None,
    options: LoadOptions,
    concurrency: int,
) -> _Fetched:
    """Allocate the arena and its sink, fetch every part into it, then wait for the device."""
    import torch

    plan = layout.plan
    fetcher = Fetcher(
        [h.source for h in heads],
        [h.info for h in heads],
        {i: (h.header.data_offset, memoryview(h.prefetched)) for i, h in enumerate(heads)},
        options,
        writers,
    )
    arena = allocate_arena(plan.arena_bytes, device)
    sink = open_sink(arena, layout.ring, device, copier, fetcher.landed)
    tensors: dict[str, torch.Tensor] = {}

    def finish(ready: list[int]) -> None:
        for i in ready:
            p = plan.placements[i]
            t = tensors[p.name] = tensor_view(arena, p, delivery.dtype)
            if delivery.on_tensor is not None:
                delivery.on_tensor(p.name, t)

    def on_landed(part: Part) -> None:
        finish(assembly.land(part))
        delivery.report(assembly, "fetch")

    try:
        finish(assembly.start())
        fetcher.run(list(layout.tasks), sink, len(plan.parts), on_landed, concurrency)
        fetched_at = time.monotonic()
    finally:
        sink.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _Fetched(tensors, fetched_at, fetcher.stats.retries, sink.copy_wait_s)

"""Load safetensors objects (one file, a sharded index, or a model directory) into one arena.

`load` runs the phases in order; each builds its output only once its inputs exist:

    resolve   loader.objects   URI → CheckpointObjects (which objects; the index's promise)
    header    loader.heads     one speculative ranged GET per object (header + first data
                               bytes), from the fastest cache tier holding it, else its origin
    plan      loader.phases    pure: check_index (loader.objects: the index's promise is
                               kept), plan_fetch → FetchLayout (loader.plan: the arena)
    allocate  loader.arena     the arena on the device and its sink (host, or pinned ring)
    fetch     loader.fetch     concurrent ranged reads into the sink; `Assembly` says which
                               tensors are complete as parts land
    finish                     sink closed, device synchronised, `load_metrics`

Tensors are handed to `on_tensor` as soon as every byte of theirs has landed; the result is
returned only when all of them have. A load that raises returns nothing: its sink is closed and
its sources are closed. A load writes no cache entry: the result's `fill_tiers()` fills the
tiers that lack what it read, when the caller chooses (`loader.fill`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loader.arena import allocate_arena, map_entry, open_sink, tensor_view
from loader.cache import cache_tiers
from loader.fetch import Fetcher
from loader.fill import FillReport, TierFill, fill_jobs
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
from loader.plan import Part
from loader.sinks import Copier
from loader.sources import LocalSource, ObjectStore

if TYPE_CHECKING:
    import torch


@dataclass
class LoadResult:
    """Tensors and metrics of a load; `fill_tiers()` then fills the cache tiers it missed.

    >>> result = loader.load("s3://models/llama/", options=options)
    >>> threading.Thread(target=result.fill_tiers, daemon=True).start()  # once serving
    """

    tensors: dict[str, torch.Tensor]  # result name → tensor on the target device
    metrics: LoadMetrics  # what the load did
    fill: TierFill  # the cache entries this load left to write (none without tiers)
    metadata: list[dict[str, str]] = field(default_factory=list)  # `__metadata__` per object

    def fill_tiers(self) -> FillReport:
        """Write the missing cache entries (blocking; any thread; idempotent; never raises
        for a failed entry, see `FillReport.failed`). Never calling it is fine too."""
        return self.fill.run()


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
    store: ObjectStore | None = None,
) -> LoadResult:
    """Load a safetensors file, shard index or model directory onto `device`.

    `dtype` converts floating tensors (on the device). `name_map` renames, skips or fuses
    tensors (see `loader.Fused`); it is first called once every header is read. `on_tensor(
    name, tensor)` is called, in this thread, for each result tensor as soon as it is
    complete; if the load then fails, the error is raised and those tensors must be
    discarded. `store` opens the objects (default: a new one for `options.s3`); pass the one
    that read the model's other files to share its S3 credentials. `copier` (tests) forces
    the staged path.
    """
    import torch

    options = options or LoadOptions()
    store = store or ObjectStore(options.s3)
    t_start = time.monotonic()
    dev = torch.device(device)
    delivery = _Delivery(dtype, on_tensor, on_progress, t_start)
    concurrency = options.resolved_concurrency()
    objects = resolve_objects(uri, options, store)
    tiers = cache_tiers(options)
    heads = read_heads(objects.uris, options, tiers, concurrency, store)
    staged = copier is not None or dev.type != "cpu"
    try:
        check_index(objects, (h.header for h in heads))
        t_header = time.monotonic()
        layout = plan_fetch(
            [h.shard() for h in heads],
            [h.stream for h in heads],
            options,
            concurrency,
            staged=staged,
            name_map=name_map,
            mapped=frozenset() if staged else _mappable(heads),
        )
        assembly = Assembly(uri, layout.plan)
        delivery.report(assembly, "header")
        fetched = _fetch(heads, layout, assembly, delivery, dev, copier, options, concurrency)
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
    fill = TierFill(fill_jobs(heads, tiers), tiers, options, store)
    return LoadResult(fetched.tensors, metrics, fill, [h.header.metadata for h in heads])


def _mappable(heads: Sequence[ObjectHead]) -> frozenset[int]:
    """Objects whose tensors a CPU load can alias: host-tier hits (entries in memory). A disk
    entry is copied: a mapping of it would be page cache, which the kernel may drop and read
    back from disk in the middle of serving."""
    return frozenset(
        i for i, h in enumerate(heads) if h.tier == "host" and isinstance(h.source, LocalSource)
    )


def _fetch(
    heads: Sequence[ObjectHead],
    layout: FetchLayout,
    assembly: Assembly,
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
    )
    mappings: dict[int, torch.Tensor] = {}
    for p in plan.placements:
        if p.mapped_object is not None and p.mapped_object not in mappings:
            entry = heads[p.mapped_object].source
            assert isinstance(entry, LocalSource), "only local entries are mapped"
            mappings[p.mapped_object] = map_entry(entry.fd, entry.stat().size)
    arena = allocate_arena(plan.arena_bytes, device)
    sink = open_sink(arena, layout.ring, device, copier, fetcher.landed)
    tensors: dict[str, torch.Tensor] = {}

    def finish(ready: list[int]) -> None:
        for i in ready:
            p = plan.placements[i]
            home = arena if p.mapped_object is None else mappings[p.mapped_object]
            t = tensors[p.name] = tensor_view(home, p, delivery.dtype)
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

"""The pure steps between the load's I/O phases: no storage, no device, no clock.

    heads ──plan_fetch──▶ FetchLayout ──(arena, sink, fetch)──▶ parts land ──Assembly──▶ tensors
                                                                      PhaseTimes ──load_metrics──▶

`plan_fetch` sizes the reads and the staging ring and orders the reads; `Assembly` tells which
tensors are complete as parts land and what to report as progress; `load_metrics` sums up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from loader.fetch import Task
from loader.heads import ObjectHead
from loader.options import LoadMetrics, LoadOptions, NameMap, Progress
from loader.plan import Part, Plan, ShardHeader, derive_part_bytes, plan_load

MIN_SLOT_CAP_BYTES = 1 << 20  # parts may always be this large, however small the ring


@dataclass(frozen=True, slots=True)
class Ring:
    """The pinned staging ring in front of a device arena: all the extra host memory a load
    uses, whatever the checkpoint size."""

    slot_bytes: int  # bytes per slot: one part, or the largest prefetched part, fits
    num_slots: int  # slots (>= 2, so receiving one part overlaps copying another)


@dataclass(frozen=True, slots=True)
class FetchLayout:
    """The plan phase's output: everything the fetch phase needs to know but the bytes."""

    plan: Plan  # where every tensor lands in the arena and which reads fetch it
    part_bytes: int  # bytes per ranged read (a reported metric)
    ring: Ring | None  # staging ring for a device arena; None: reads land in host memory
    tasks: tuple[Task, ...]  # the reads in issue order: prefetched parts first


def plan_fetch(
    shards: Sequence[ShardHeader],
    streams: Sequence[bool],
    options: LoadOptions,
    concurrency: int,
    staged: bool,
    name_map: NameMap | None = None,
    mapped: frozenset[int] = frozenset(),
) -> FetchLayout:
    """Size the parts (within a staging slot when `staged`) and plan the load.

    `streams[i]`: object i is read as one stream (its server ignores Range); `mapped`: the
    objects memory-mapped for the result to alias (see `loader.plan`).
    """
    total_data = sum(s.header.data_size for s in shards)
    ring_bytes = options.resolved_ring_bytes()
    slot_cap = max(MIN_SLOT_CAP_BYTES, ring_bytes // (2 * concurrency)) if staged else None
    part_bytes = options.part_bytes or derive_part_bytes(
        total_data, concurrency, options.bandwidth_bps, slot_cap
    )
    plan = plan_load(list(shards), part_bytes, name_map, mapped)
    ring = ring_for(plan, part_bytes, ring_bytes) if staged else None
    return FetchLayout(plan, part_bytes, ring, fetch_tasks(plan, streams))


def ring_for(plan: Plan, part_bytes: int, ring_bytes: int) -> Ring:
    """Slots big enough for every part (a prefetched part is never split), within `ring_bytes`
    but never fewer than two."""
    slot_bytes = max(part_bytes, max((p.size_bytes for p in plan.parts if p.prefetched), default=0))
    return Ring(slot_bytes, max(2, ring_bytes // slot_bytes))


def fetch_tasks(plan: Plan, streams: Sequence[bool]) -> tuple[Task, ...]:
    """Prefetched parts first (no I/O), then by object and offset; one task per stream."""
    first = [Task((p,), False) for p in plan.parts if p.prefetched]
    rest: list[tuple[list[Part], bool]] = []  # (parts, stream) in issue order
    streamed: dict[int, list[Part]] = {}  # object → the parts of its stream task
    for p in plan.parts:
        if p.prefetched:
            continue
        if not streams[p.shard]:
            rest.append(([p], False))
        elif p.shard in streamed:
            streamed[p.shard].append(p)
        else:
            streamed[p.shard] = [p]
            rest.append((streamed[p.shard], True))
    return (*first, *(Task(tuple(parts), stream) for parts, stream in rest))


class Assembly:
    """Which tensors are complete as parts land; the numbers progress reports.

    Used from one thread (the caller's). NOTE: each placement is reported complete exactly
    once: by `start` when no part carries its bytes (empty tensors), else by the `land` of its
    last part.
    """

    def __init__(self, uri: str, plan: Plan) -> None:
        self._uri = uri
        self._plan = plan
        self._remaining = list(plan.tensor_parts)  # per placement: parts still to land
        self.bytes_done = plan.mapped_bytes  # data bytes landed (mapped ones are from the start)
        self.num_ready = 0  # placements reported complete

    @property
    def complete(self) -> bool:
        return self.num_ready == len(self._plan.placements)

    def start(self) -> list[int]:
        """Placements complete before any part lands (no bytes to fetch)."""
        ready = [i for i, n in enumerate(self._plan.tensor_parts) if n == 0]
        self.num_ready += len(ready)
        return ready

    def land(self, part: Part) -> list[int]:
        """Placements this part completes."""
        self.bytes_done += part.size_bytes
        ready = []
        for i in self._plan.part_tensors[part.index]:
            self._remaining[i] -= 1
            if self._remaining[i] == 0:
                ready.append(i)
        self.num_ready += len(ready)
        return ready

    def progress(self, phase: str, elapsed_s: float) -> Progress:
        plan = self._plan
        return Progress(
            self._uri,
            phase,
            self.bytes_done,
            plan.fetch_bytes + plan.mapped_bytes,
            self.num_ready,
            len(plan.placements),
            elapsed_s,
        )


@dataclass(frozen=True, slots=True)
class PhaseTimes:
    """Monotonic clock readings at the phase boundaries of one load."""

    start: float  # the load began
    header: float  # every header read
    fetch: float  # every part landed in the arena (staged parts: their copies completed)
    end: float  # device copies synchronised, cache entries committed


def load_metrics(
    uri: str,
    times: PhaseTimes,
    heads: Sequence[ObjectHead],
    layout: FetchLayout,
    *,
    concurrency: int,
    num_retries: int,
    copy_wait_s: float,
    device: str,
) -> LoadMetrics:
    phases = {
        "header": times.header - times.start,
        "fetch": times.fetch - times.header,
        "copy": copy_wait_s,
        "finish": times.end - times.fetch,
    }
    return LoadMetrics(
        uri=uri,
        bytes_total=layout.plan.fetch_bytes + layout.plan.mapped_bytes,
        mapped_bytes=layout.plan.mapped_bytes,
        seconds=times.end - times.start,
        phases_s=phases,
        num_objects=len(heads),
        num_parts=len(layout.plan.parts),
        num_retries=num_retries,
        concurrency=concurrency,
        part_bytes=layout.part_bytes,
        cache_hits=sum(h.cache_hit for h in heads),
        device=device,
        tier_hits=dict(Counter(h.tier for h in heads if h.cache_hit and h.tier)),
    )

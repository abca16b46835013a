"""Plan a load in bytes (pure): where every tensor lands in one arena, and which ranged reads
fetch which bytes.

The arena is one allocation on the destination device. With no name mapping it is a byte image
of the data sections of all objects (each object starts 256-byte aligned); a tensor whose
offset does not suit its dtype is moved to the next aligned offset (so every tensor is a view,
never a copy), and `Fused` members are placed next to each other in index order, so a fused
tensor is also a view. Skipped tensors (name map → None) are not fetched when they leave a gap
of at least `MERGE_GAP_BYTES`; smaller gaps are fetched and discarded (one GET beats two).

Objects that are memory-mapped (`mapped`: host-tier entries on a CPU load) need no arena for
the tensors that are already laid out in them as the result wants them: stored contiguously
(a fused tensor's members next to each other, in index order) at an offset that suits the
dtype. Those placements are views of the mapping (`Placement.mapped_object`) and fetch nothing;
the others (typically q/k/v, stored apart) are copied into the arena as usual.

NOTE: parts never span two objects, and a part's segments are sorted by object offset and
cover only bytes inside the part.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from loader.errors import CorruptCheckpoint
from loader.header import Header, TensorEntry
from loader.options import Fused, MiB, NameMap

ARENA_ALIGN = 256  # start of every object's run and of every fused tensor in the arena
MERGE_GAP_BYTES = 1 * MiB  # skipped bytes below this are fetched and discarded
MIN_PART_BYTES = 1 * MiB
MAX_PART_BYTES = 64 * MiB
# Seconds of transfer per part and connection: long enough to amortise a request (~1 ms),
# short enough that a retry or a slow connection costs little and the tail stays short.
TARGET_PART_S = 0.025


@dataclass(frozen=True, slots=True)
class ShardHeader:
    uri: str  # the object
    object_size: int  # bytes in the object
    header: Header  # its parsed header
    prefetched_end: int  # object bytes [header.data_offset, prefetched_end) are already received


@dataclass(frozen=True, slots=True)
class Placement:
    name: str  # name in the result
    dtype: str  # safetensors dtype code
    shape: tuple[int, ...]  # result shape
    arena_offset: int  # byte offset in the arena (in the object when `mapped_object` is set)
    size_bytes: int  # bytes in the arena
    sources: tuple[str, ...]  # checkpoint tensor names that fill it (several when fused)
    mapped_object: int | None = None  # the mapped object it is a view of; None: the arena


@dataclass(frozen=True, slots=True)
class Segment:
    obj_start: int  # object offset of the first byte
    length: int  # bytes
    arena_offset: int  # where the first byte goes


@dataclass(frozen=True, slots=True)
class Part:
    index: int  # position in Plan.parts
    shard: int  # index of the object
    start: int  # object offset, inclusive
    end: int  # object offset, exclusive
    segments: tuple[Segment, ...]  # destinations; bytes of the part outside them are discarded
    prefetched: bool  # bytes already received with the header (no request needed)

    @property
    def size_bytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...]  # one per result tensor
    parts: tuple[Part, ...]  # reads, in object then offset order
    part_tensors: tuple[tuple[int, ...], ...]  # per part: placements it carries bytes of
    tensor_parts: tuple[int, ...]  # per placement: how many parts carry its bytes
    arena_bytes: int  # size of the arena
    fetch_bytes: int  # bytes received (data sections; includes discarded gaps)
    mapped_bytes: int = 0  # bytes of the placements that are views of mapped objects


def derive_part_bytes(
    total_bytes: int,
    concurrency: int,
    bandwidth_bps: float,
    max_slot_bytes: int | None = None,
) -> int:
    """Bytes per ranged GET from the link and the core count, not a constant.

    `TARGET_PART_S` of transfer per connection at `bandwidth_bps / concurrency`, no more than
    a quarter of each connection's share of the load (so the work balances and the tail is
    short), within [1, 64] MiB and within one staging slot; rounded to 64 KiB.
    """
    size = int(bandwidth_bps / max(1, concurrency) * TARGET_PART_S)
    size = min(size, max(total_bytes // (4 * max(1, concurrency)), 1))
    size = max(MIN_PART_BYTES, min(MAX_PART_BYTES, size))
    if max_slot_bytes is not None:
        size = min(size, max_slot_bytes)
    return max(64 << 10, size // (64 << 10) * (64 << 10))


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass
class _Target:
    name: str
    members: list[tuple[int, int, TensorEntry]]  # (fuse index, shard, entry)
    fused: bool


def _targets(shards: list[ShardHeader], name_map: NameMap | None) -> list[_Target]:
    """Result tensors in first-appearance order, with the checkpoint entries that fill them."""
    targets: dict[str, _Target] = {}
    origin: dict[str, str] = {}
    for s, shard in enumerate(shards):
        for e in shard.header.entries:
            if e.name in origin:
                raise CorruptCheckpoint(
                    shard.uri, f"tensor also stored in {origin[e.name]}; shards overlap", e.name
                )
            origin[e.name] = shard.uri
            mapped = name_map(e.name) if name_map else e.name
            if mapped is None:
                continue
            if isinstance(mapped, Fused):
                t = targets.setdefault(mapped.target, _Target(mapped.target, [], True))
                if not t.fused:
                    raise ValueError(f"name map sends {e.name!r} and others to {t.name!r}")
                t.members.append((mapped.index, s, e))
            else:
                if mapped in targets:
                    raise ValueError(f"name map sends {e.name!r} and others to {mapped!r}")
                targets[mapped] = _Target(mapped, [(0, s, e)], False)
    for t in targets.values():
        t.members.sort(key=lambda m: m[0])
        if [m[0] for m in t.members] != list(range(len(t.members))):
            got = [m[0] for m in t.members]
            raise ValueError(f"fused tensor {t.name!r} has member indices {got}; need 0..n-1")
    return list(targets.values())


def _fused_shape(t: _Target) -> tuple[str, tuple[int, ...]]:
    first = t.members[0][2]
    for _, _, e in t.members:
        if e.dtype != first.dtype or not e.shape or e.shape[1:] != first.shape[1:]:
            members = ", ".join(f"{m.name} {m.dtype}{list(m.shape)}" for _, _, m in t.members)
            raise ValueError(f"cannot fuse {t.name!r} along dim 0 from {members}")
    return first.dtype, (sum(e.shape[0] for _, _, e in t.members), *first.shape[1:])


def plan_load(
    shards: list[ShardHeader],
    part_bytes: int,
    name_map: NameMap | None = None,
    mapped: frozenset[int] = frozenset(),
) -> Plan:
    """Lay out the arena and split the needed bytes into parts of at most `part_bytes`;
    tensors already laid out right in a `mapped` object are views of it instead."""
    targets = _targets(shards, name_map)
    # Where each (shard, entry start) lands, and which placement it fills.
    dest: dict[tuple[int, str], tuple[int, int]] = {}
    placements: list[Placement] = []
    mapped_bytes = 0
    in_arena: list[_Target] = []
    for t in targets:
        offset = _mapped_offset(t, shards, mapped)
        if offset is None:
            in_arena.append(t)
            continue
        first = t.members[0][2]
        dtype, shape = _fused_shape(t) if t.fused else (first.dtype, first.shape)
        size = sum(e.size_bytes for *_, e in t.members)
        sources = tuple(e.name for *_, e in t.members)
        placements.append(Placement(t.name, dtype, shape, offset, size, sources, t.members[0][1]))
        mapped_bytes += size
    cursor = 0
    last_shard = -1
    # Walk the objects in order so that, with no mapping, the arena is their byte image.
    order = sorted(
        range(len(in_arena)),
        key=lambda i: (in_arena[i].members[0][1], in_arena[i].members[0][2].start),
    )
    for i in order:
        t = in_arena[i]
        shard_index = t.members[0][1]
        if shard_index != last_shard:
            cursor, last_shard = _align(cursor, ARENA_ALIGN), shard_index
        if t.fused:
            dtype, shape = _fused_shape(t)
            cursor = _align(cursor, ARENA_ALIGN)
        else:
            e = t.members[0][2]
            dtype, shape = e.dtype, e.shape
            cursor = _align(cursor, e.itemsize)
        start = cursor
        for _, s, e in t.members:
            dest[(s, e.name)] = (cursor, len(placements))
            cursor += e.size_bytes
        placements.append(
            Placement(
                t.name, dtype, shape, start, cursor - start, tuple(e.name for *_, e in t.members)
            )
        )
    parts: list[Part] = []
    part_tensors: list[tuple[int, ...]] = []
    tensor_parts = [0] * len(placements)
    fetch_bytes = 0
    for s, shard in enumerate(shards):
        base = shard.header.data_offset
        # Entry-level destinations of this object, by object offset.
        runs: list[tuple[int, int, int, int]] = []  # (obj_start, length, arena_offset, placement)
        for e in shard.header.entries:
            if (s, e.name) in dest and e.size_bytes:
                off, p = dest[(s, e.name)]
                runs.append((base + e.start, e.size_bytes, off, p))
        spans = _spans(runs, base, shard.prefetched_end)
        for span_start, span_end, prefetched in spans:
            for start, end in _split(span_start, span_end, part_bytes, prefetched):
                segs, ids = _clip(runs, start, end)
                for p in ids:
                    tensor_parts[p] += 1
                parts.append(Part(len(parts), s, start, end, segs, prefetched))
                part_tensors.append(ids)
                fetch_bytes += end - start
    return Plan(
        tuple(placements),
        tuple(parts),
        tuple(part_tensors),
        tuple(tensor_parts),
        cursor,
        fetch_bytes,
        mapped_bytes,
    )


def _mapped_offset(t: _Target, shards: list[ShardHeader], mapped: frozenset[int]) -> int | None:
    """The object offset where `t` already lies as the result wants it, in a mapped object;
    None if it must be copied (not mapped, members apart or out of order, misaligned)."""
    s = t.members[0][1]
    if s not in mapped or any(m[1] != s for m in t.members):
        return None
    entries = [e for *_, e in t.members]
    if any(a.end != b.start or a.dtype != b.dtype for a, b in itertools.pairwise(entries)):
        return None
    offset = shards[s].header.data_offset + entries[0].start
    return offset if offset % entries[0].itemsize == 0 else None


def _spans(
    runs: list[tuple[int, int, int, int]], base: int, prefetched_end: int
) -> list[tuple[int, int, bool]]:
    """Object ranges to read: runs merged across small gaps; the prefetched head split off."""
    merged: list[list[int]] = []
    for obj_start, length, _, _ in runs:
        if merged and obj_start - merged[-1][1] < MERGE_GAP_BYTES:
            merged[-1][1] = obj_start + length
        else:
            merged.append([obj_start, obj_start + length])
    out: list[tuple[int, int, bool]] = []
    head_end = max(base, prefetched_end)
    for a, b in merged:
        if a < head_end:
            out.append((a, min(b, head_end), True))
            a = min(b, head_end)
        if a < b:
            out.append((a, b, False))
    return out


def _split(start: int, end: int, part_bytes: int, prefetched: bool) -> list[tuple[int, int]]:
    if prefetched:
        return [(start, end)]  # already in memory: one part whatever its size
    n = max(1, -(-(end - start) // part_bytes))
    step = -(-(end - start) // n)
    return [(a, min(a + step, end)) for a in range(start, end, step)]


def _clip(
    runs: list[tuple[int, int, int, int]], start: int, end: int
) -> tuple[tuple[Segment, ...], tuple[int, ...]]:
    segs: list[Segment] = []
    ids: dict[int, None] = {}
    # runs are sorted and disjoint: start at the first one ending after `start`
    i = bisect.bisect_right(runs, start, key=lambda r: r[0] + r[1])
    for obj_start, length, arena_offset, p in runs[i:]:
        if obj_start >= end:
            break
        a, b = max(start, obj_start), min(end, obj_start + length)
        off = arena_offset + (a - obj_start)
        if (
            segs
            and segs[-1].obj_start + segs[-1].length == a
            and (segs[-1].arena_offset + segs[-1].length == off)
        ):
            last = segs.pop()
            segs.append(Segment(last.obj_start, last.length + b - a, last.arena_offset))
        else:
            segs.append(Segment(a, b - a, off))
        ids[p] = None
    return tuple(segs), tuple(ids)

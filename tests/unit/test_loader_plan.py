"""Pure parts of the loader: header validation, arena layout, part planning, timeouts, cache."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from loader import CorruptCheckpoint, Fused, LoadOptions, UnsupportedDtype
from loader.cache import DiskCache
from loader.fetch import TimeoutPolicy
from loader.header import header_length, parse_header
from loader.http import ObjectInfo
from loader.plan import ARENA_ALIGN, ShardHeader, derive_part_bytes, plan_load

MiB = 1 << 20


def header(entries: dict[str, tuple[str, list[int], int, int]]) -> bytes:
    return json.dumps(
        {n: {"dtype": d, "shape": s, "data_offsets": [a, b]} for n, (d, s, a, b) in entries.items()}
    ).encode()


def shard(entries: dict[str, tuple[str, list[int], int, int]], prefetched: int = 0) -> ShardHeader:
    raw = header(entries)
    size = 8 + len(raw) + max((e[3] for e in entries.values()), default=0)
    h = parse_header("mem://x", raw, size)
    return ShardHeader("mem://x", size, h, h.data_offset + prefetched)


def test_header_must_tile_the_data_section() -> None:
    ok = header({"a": ("F32", [2], 0, 8), "b": ("I8", [3], 8, 11)})
    h = parse_header("u", ok, 8 + len(ok) + 11)
    assert [e.name for e in h.entries] == ["a", "b"] and h.data_size == 11
    with pytest.raises(CorruptCheckpoint, match="hole"):
        parse_header("u", header({"a": ("F32", [2], 4, 12)}), 8 + len(ok) + 12)
    raw = header({"a": ("F32", [2], 0, 8), "b": ("F32", [2], 4, 12)})
    with pytest.raises(CorruptCheckpoint, match="overlaps"):
        parse_header("u", raw, 8 + len(raw) + 12)
    raw = header({"a": ("F32", [2], 0, 8)})
    with pytest.raises(CorruptCheckpoint, match="describes 8 data bytes but the object has 9"):
        parse_header("u", raw, 8 + len(raw) + 9)
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        parse_header("u", raw, 8 + len(raw) + 4)
    with pytest.raises(UnsupportedDtype, match="C64"):
        parse_header("u", header({"a": ("C64", [1], 0, 8)}), 100)
    with pytest.raises(CorruptCheckpoint, match="not a JSON object"):
        parse_header("u", b"[1]", 11)


def test_header_length_is_checked_against_the_object() -> None:
    assert header_length("u", struct.pack("<Q", 10), 100) == 10
    with pytest.raises(CorruptCheckpoint, match="too small"):
        header_length("u", b"", 3)
    with pytest.raises(CorruptCheckpoint, match="does not fit"):
        header_length("u", struct.pack("<Q", 200), 100)


def test_identity_layout_is_a_byte_image_with_one_segment_per_part() -> None:
    s = shard({"a": ("F32", [1024], 0, 4096), "b": ("F16", [2048], 4096, 8192)})
    plan = plan_load([s], part_bytes=3000)
    assert plan.arena_bytes == 8192 and plan.mapped_bytes == 0
    assert [p.name for p in plan.placements] == ["a", "b"]
    assert [p.arena_offset for p in plan.placements] == [0, 4096]
    for part in plan.parts:
        assert part.size_bytes <= 3000
        assert len(part.segments) == 1
        seg = part.segments[0]
        assert seg.arena_offset == seg.obj_start - s.header.data_offset  # byte image
    assert sum(p.size_bytes for p in plan.parts) == 8192 == plan.fetch_bytes
    # every placement needs exactly the parts that overlap it
    assert plan.tensor_parts == (2, 2)  # parts: [0,2731) [2731,5462) [5462,8192)


def test_odd_offsets_are_realigned_not_copied() -> None:
    s = shard({"x": ("I8", [3], 0, 3), "y": ("F32", [2], 3, 11), "z": ("BF16", [1], 11, 13)})
    plan = plan_load([s], part_bytes=MiB)
    offs = {p.name: p.arena_offset for p in plan.placements}
    assert offs["y"] % 4 == 0 and offs["z"] % 2 == 0
    (part,) = plan.parts
    # x at 0; y moves to 4; z follows y at 12 with no gap, so y and z share one segment
    assert [(g.obj_start - s.header.data_offset, g.length) for g in part.segments] == [
        (0, 3),
        (3, 10),
    ]


def test_fused_members_are_adjacent_in_index_order() -> None:
    s = shard(
        {
            "k": ("F16", [2, 4], 0, 16),
            "other": ("F16", [4], 16, 24),
            "q": ("F16", [4, 4], 24, 56),
            "v": ("F16", [2, 4], 56, 72),
        }
    )
    order = {"q": 0, "k": 1, "v": 2}

    def name_map(n: str) -> str | Fused | None:
        return Fused("qkv", order[n]) if n in order else n

    plan = plan_load([s], part_bytes=MiB, name_map=name_map)
    by_name = {p.name: p for p in plan.placements}
    qkv = by_name["qkv"]
    assert qkv.shape == (8, 4) and qkv.sources == ("q", "k", "v")
    assert qkv.arena_offset % ARENA_ALIGN == 0 and qkv.size_bytes == 64
    dest = {
        g.obj_start - s.header.data_offset: g.arena_offset for p in plan.parts for g in p.segments
    }
    assert dest[24] == qkv.arena_offset  # q first
    assert dest[0] == qkv.arena_offset + 32  # then k
    assert dest[56] == qkv.arena_offset + 48  # then v


def test_bad_fusions_are_refused() -> None:
    s = shard({"a": ("F16", [2, 4], 0, 16), "b": ("F32", [2, 4], 16, 48)})
    with pytest.raises(ValueError, match="cannot fuse"):
        plan_load([s], MiB, name_map=lambda n: Fused("ab", 0 if n == "a" else 1))
    with pytest.raises(ValueError, match="member indices"):
        plan_load([s], MiB, name_map=lambda n: Fused("ab", 0 if n == "a" else 2))
    with pytest.raises(ValueError, match="sends"):
        plan_load([s], MiB, name_map=lambda n: "same")


def test_tensors_laid_out_right_in_a_mapped_object_are_views_of_it() -> None:
    """Contiguous, in fuse order, aligned: a view of the mapping (no arena bytes, no reads);
    q/k/v stored as k, q, v and a misaligned F32 are copied into the arena."""
    entries = {
        "a": ("F32", [4], 0, 16),
        "gate": ("F16", [2, 4], 16, 32),
        "up": ("F16", [2, 4], 32, 48),
        "k": ("F16", [1, 4], 48, 56),
        "q": ("F16", [2, 4], 56, 72),
        "v": ("F16", [1, 4], 72, 80),
        "odd": ("U8", [3], 80, 83),
        "w": ("F32", [1], 83, 87),
    }
    raw = header(entries)
    raw += b" " * (-(8 + len(raw)) % 8)  # the data section starts 8-aligned, as safetensors does
    h = parse_header("mem://x", raw, 8 + len(raw) + 87)
    s = ShardHeader("mem://x", 8 + len(raw) + 87, h, h.data_offset)
    fuse = {"gate": ("gu", 0), "up": ("gu", 1), "q": ("qkv", 0), "k": ("qkv", 1), "v": ("qkv", 2)}

    def name_map(n: str) -> str | Fused:
        return Fused(*fuse[n]) if n in fuse else n

    plan = plan_load([s], MiB, name_map, mapped=frozenset({0}))
    where = {p.name: (p.mapped_object, p.arena_offset) for p in plan.placements}
    base = h.data_offset
    assert (
        where["a"] == (0, base) and where["gu"] == (0, base + 16) and where["odd"] == (0, base + 80)
    )
    assert where["qkv"][0] is None and where["w"][0] is None
    gu = next(p for p in plan.placements if p.name == "gu")
    assert gu.shape == (4, 4) and gu.size_bytes == 32
    assert plan.mapped_bytes == 16 + 32 + 3
    assert plan.arena_bytes <= 32 + 4 + ARENA_ALIGN
    mapped = [i for i, p in enumerate(plan.placements) if p.mapped_object is not None]
    assert all(plan.tensor_parts[i] == 0 for i in mapped)  # complete before any read
    (part,) = plan.parts  # k, q, v, [odd: 3 bytes fetched and discarded], w
    assert (part.start, part.end) == (base + 48, base + 87)
    assert sum(g.length for g in part.segments) == 36
    # not mapped: the same checkpoint is all arena
    assert plan_load([s], MiB, name_map).mapped_bytes == 0


def test_skipped_tensors_are_not_fetched_when_the_gap_is_large() -> None:
    big = 4 * MiB
    s = shard(
        {
            "keep1": ("U8", [10], 0, 10),
            "skip": ("U8", [big], 10, 10 + big),
            "keep2": ("U8", [10], 10 + big, 20 + big),
        }
    )
    plan = plan_load([s], part_bytes=MiB, name_map=lambda n: None if n == "skip" else n)
    assert plan.fetch_bytes == 20
    assert [p.name for p in plan.placements] == ["keep1", "keep2"]
    small = shard({"a": ("U8", [10], 0, 10), "b": ("U8", [10], 10, 20), "c": ("U8", [5], 20, 25)})
    plan = plan_load([small], part_bytes=MiB, name_map=lambda n: None if n == "b" else n)
    assert plan.fetch_bytes == 25  # a small gap is fetched and discarded: one request
    (part,) = plan.parts
    assert sum(g.length for g in part.segments) == 15


def test_prefetched_head_becomes_its_own_part() -> None:
    s = shard({"a": ("U8", [100], 0, 100), "b": ("U8", [300], 100, 400)}, prefetched=150)
    plan = plan_load([s], part_bytes=100)
    assert plan.parts[0].prefetched and plan.parts[0].size_bytes == 150
    assert not any(p.prefetched for p in plan.parts[1:])
    assert all(p.size_bytes <= 100 for p in plan.parts[1:])
    assert plan.tensor_parts[0] == 1  # `a` is complete with the header read alone


def test_shards_start_aligned_and_duplicate_names_are_corrupt() -> None:
    a = shard({"x": ("I8", [3], 0, 3)})
    b = shard({"y": ("I8", [5], 0, 5)})
    plan = plan_load([a, b], part_bytes=MiB)
    assert [p.arena_offset for p in plan.placements] == [0, ARENA_ALIGN]
    assert [p.shard for p in plan.parts] == [0, 1]
    with pytest.raises(CorruptCheckpoint, match="shards overlap"):
        plan_load([a, a], part_bytes=MiB)


def test_part_size_follows_bandwidth_cores_and_ring() -> None:
    gb = 1 << 30
    slow = derive_part_bytes(gb, 4, 1.25e8)
    fast = derive_part_bytes(gb, 4, 1.25e10)
    assert MiB <= slow < fast <= 64 * MiB
    assert derive_part_bytes(gb, 16, 1.25e9) < derive_part_bytes(gb, 2, 1.25e9)
    assert derive_part_bytes(8 * MiB, 4, 1.25e10) <= 2 * MiB  # small loads still spread
    assert derive_part_bytes(gb, 4, 1.25e10, max_slot_bytes=4 * MiB) == 4 * MiB


def test_timeouts_become_relative_to_observed_parts() -> None:
    o = LoadOptions(timeout_s=30, min_part_timeout_s=0.5, slowdown_factor=8)
    policy = TimeoutPolicy(o)
    assert policy.timeout_for(MiB, 0) == 30
    for _ in range(3):
        policy.observe(MiB, 0.1)
    assert policy.timeout_for(MiB, 0) == pytest.approx(0.8)
    assert policy.timeout_for(MiB, 2) == pytest.approx(3.2)  # doubles per retry
    assert policy.timeout_for(1000, 0) == 0.5  # floor


def test_disk_cache_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=250)
    infos = {u: ObjectInfo(100, f"etag-{u}") for u in ("a", "b", "c")}
    for i, u in enumerate(("a", "b")):
        w = cache.writer(u, infos[u])
        assert w is not None
        w.write(0, bytes([i]) * 100)
        w.commit()
    import os

    os.utime(cache.path_for("a", infos["a"]), (1, 1))
    os.utime(cache.path_for("b", infos["b"]), (2, 2))
    assert cache.lookup("a", infos["a"]) is not None  # refreshes a: b is now the oldest
    w = cache.writer("c", infos["c"])
    assert w is not None
    w.write(0, b"c" * 100)
    w.commit()
    assert cache.lookup("b", infos["b"]) is None
    assert cache.lookup("a", infos["a"]) is not None
    assert cache.lookup("c", infos["c"]) is not None
    assert cache.lookup("c", ObjectInfo(100, "other-etag")) is None  # a new version misses
    assert cache.writer("huge", ObjectInfo(1000, "e")) is None
    w = cache.writer("d", ObjectInfo(100, "e"))
    assert w is not None
    w.abort()
    assert not list(tmp_path.glob("*.partial"))

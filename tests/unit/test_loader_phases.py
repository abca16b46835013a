"""Pure steps between the loader's I/O phases: fetch layout and ring sizing, read order,
tensor completion and progress, metrics, the index check, and where a URI's objects are."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from loader import CorruptCheckpoint, LoadOptions, ObjectNotFound
from loader.heads import ObjectHead
from loader.http import ObjectInfo
from loader.objects import INDEX_NAME, CheckpointObjects, check_index, resolve_objects
from loader.phases import (
    MIN_SLOT_CAP_BYTES,
    Assembly,
    PhaseTimes,
    fetch_tasks,
    load_metrics,
    plan_fetch,
    ring_for,
)
from loader.plan import ShardHeader, plan_load
from tests.unit.test_loader_plan import shard

MiB = 1 << 20


def two_tensors(prefetched: int = 0, prefix: str = "") -> ShardHeader:
    """a: 6 KiB, e: empty, b: 10 KiB; `prefetched` data bytes came with the header."""
    a, e, b = (f"{prefix}{n}" for n in "aeb")
    entries = {
        a: ("F32", [1536], 0, 6144),
        e: ("F32", [0], 6144, 6144),
        b: ("I8", [10240], 6144, 16384),
    }
    return shard(entries, prefetched)


def test_host_loads_have_no_ring_and_parts_sized_from_the_link() -> None:
    options = LoadOptions(bandwidth_bps=1e12)
    layout = plan_fetch([two_tensors()], [False], options, concurrency=4, staged=False)
    assert layout.ring is None
    assert layout.part_bytes == 1 * MiB  # a quarter of each connection's share, floored at 1 MiB
    assert layout.plan.fetch_bytes == 16384


def test_staged_parts_fit_a_slot_and_the_ring_holds_at_least_two() -> None:
    options = LoadOptions(bandwidth_bps=1e12, ring_bytes=64 * MiB)
    big = shard({"w": ("U8", [256 * MiB], 0, 256 * MiB)})
    layout = plan_fetch([big], [False], options, concurrency=4, staged=True)
    assert layout.ring is not None
    assert layout.part_bytes == 8 * MiB  # ring / (2 × concurrency)
    assert layout.ring.slot_bytes == 8 * MiB and layout.ring.num_slots == 8
    # a tiny ring still allows 1 MiB parts, and two slots
    tiny = plan_fetch([big], [False], LoadOptions(ring_bytes=MiB), concurrency=4, staged=True)
    assert tiny.part_bytes == MIN_SLOT_CAP_BYTES
    assert tiny.ring is not None and tiny.ring.num_slots == 2


def test_default_ring_comes_from_host_memory_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert LoadOptions(ring_bytes=3 * MiB).resolved_ring_bytes() == 3 * MiB
    page = 4096
    for memory, expected in ((1 << 30, 64 * MiB), (24 << 30, 768 * MiB), (128 << 30, 1 << 30)):
        names = {"SC_PAGE_SIZE": page, "SC_PHYS_PAGES": memory // page}
        monkeypatch.setattr("os.sysconf", lambda name, n=names: n[name])
        assert LoadOptions().resolved_ring_bytes() == expected


def test_default_gpu_load_on_16_connections_uses_parts_of_mebibytes_not_a_few() -> None:
    # An 8B checkpoint staged for a GPU: the defaults must not shrink parts to 2 MiB (that
    # halved the load's speed on an H100 host; docs/benchmarks.md).
    big = shard({"w": ("U8", [16 << 30], 0, 16 << 30)})
    layout = plan_fetch([big], [False], LoadOptions(ring_bytes=1 << 30), 16, staged=True)
    assert layout.part_bytes >= 16 * MiB
    assert layout.ring is not None and layout.ring.num_slots >= 2 * 16


def test_a_prefetched_part_larger_than_a_part_widens_the_slots() -> None:
    plan = plan_load([two_tensors(prefetched=9000)], part_bytes=4096)
    assert max(p.size_bytes for p in plan.parts if p.prefetched) == 9000
    ring = ring_for(plan, part_bytes=4096, ring_bytes=40000)
    assert ring.slot_bytes == 9000 and ring.num_slots == 4


def test_prefetched_parts_go_first_and_a_stream_is_one_task_in_place() -> None:
    shards = [two_tensors(2000, "0."), two_tensors(0, "1."), two_tensors(0, "2.")]
    plan = plan_load(shards, part_bytes=4096)
    tasks = fetch_tasks(plan, [False, True, False])
    assert tasks[0].parts[0].prefetched and not tasks[0].stream
    assert all(not p.prefetched for t in tasks[1:] for p in t.parts)
    order = [(t.parts[0].shard, len(t.parts), t.stream) for t in tasks[1:]]
    # object 0's rest one part per task, object 1 as one stream, then object 2 part by part
    assert order == [(0, 1, False)] * 4 + [(1, 4, True)] + [(2, 1, False)] * 4
    streamed = next(t for t in tasks if t.stream)
    assert [p.start for p in streamed.parts] == sorted(p.start for p in streamed.parts)
    assert sorted(p.index for t in tasks for p in t.parts) == list(range(len(plan.parts)))


def test_assembly_reports_each_tensor_once_when_its_last_part_lands() -> None:
    plan = plan_load([two_tensors()], part_bytes=4096)  # parts: 4096 × 4
    assembly = Assembly("mem://x", plan)
    header = assembly.progress("header", 0.5)
    assert (header.bytes_done, header.bytes_total, header.tensors_ready) == (0, 16384, 0)
    assert header.tensors_total == 3 and header.phase == "header" and header.elapsed_s == 0.5
    names = [plan.placements[i].name for i in assembly.start()]
    assert names == ["e"]  # no bytes: complete before any part lands
    landed = [[plan.placements[i].name for i in assembly.land(p)] for p in plan.parts]
    assert landed == [[], ["a"], [], ["b"]]
    assert assembly.complete and assembly.num_ready == 3
    assert assembly.progress("done", 1.0).bytes_done == 16384


def _head(i: int, tier: str | None = None) -> ObjectHead:
    s = two_tensors(prefix=f"{i}.")
    return ObjectHead(
        SimpleNamespace(uri=f"mem://{i}", remote=True),  # type: ignore[arg-type]  # never read
        ObjectInfo(s.object_size, "etag"),
        s.header,
        b"",
        bytearray(),
        False,
        tier,
    )


def test_metrics_name_the_phases_and_count_cache_hits_per_tier() -> None:
    heads = [_head(0), _head(1, tier="host"), _head(2, tier="disk"), _head(3, tier="host")]
    layout = plan_fetch(
        [h.shard() for h in heads], [False] * 4, LoadOptions(part_bytes=4096), 2, staged=False
    )
    times = PhaseTimes(start=10.0, header=13.5, fetch=15.0, end=15.25)
    m = load_metrics(
        "mem://x",
        times,
        heads,
        layout,
        concurrency=2,
        num_retries=1,
        copy_wait_s=0.125,
        device="cpu",
    )
    assert m.phases_s == {"header": 3.5, "fetch": 1.5, "copy": 0.125, "finish": 0.25}
    assert m.seconds == 5.25 and m.bytes_total == 4 * 16384 and m.part_bytes == 4096
    assert (m.num_objects, m.num_parts, m.cache_hits) == (4, 16, 3)
    assert m.tier_hits == {"host": 2, "disk": 1}


def test_every_tensor_the_index_promises_must_be_in_a_shard() -> None:
    header = two_tensors().header
    check_index(CheckpointObjects(("u",), None, frozenset({"zzz"})), [header])  # no index
    promised = frozenset({"a", "b", "missing"})
    check_index(CheckpointObjects(("u",), "i.json", frozenset({"a", "b"})), [header])
    with pytest.raises(CorruptCheckpoint, match=r"i\.json: 1 tensors .* \(first: missing\)"):
        check_index(CheckpointObjects(("u",), "i.json", promised), [header])


def test_a_uri_resolves_to_a_file_an_index_or_a_directory(tmp_path: Path) -> None:
    options = LoadOptions()
    single = tmp_path / "one.safetensors"
    single.write_bytes(b"")
    assert resolve_objects(str(single), options).uris == (str(single),)
    listed = resolve_objects(str(tmp_path), options)
    assert listed.uris == (f"{tmp_path}/one.safetensors",) and listed.index_uri is None
    weight_map = {"a": "s-2.safetensors", "b": "s-1.safetensors", "c": "s-2.safetensors"}
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    indexed = resolve_objects(str(tmp_path), options)
    assert indexed.uris == (f"{tmp_path}/s-1.safetensors", f"{tmp_path}/s-2.safetensors")
    assert indexed.index_uri == f"{tmp_path}/{INDEX_NAME}"
    assert indexed.promised == {"a", "b", "c"}
    (tmp_path / INDEX_NAME).write_text("{}")
    with pytest.raises(CorruptCheckpoint, match="unreadable shard index"):
        resolve_objects(str(tmp_path), options)
    with pytest.raises(ObjectNotFound, match=r"found: nothing"):
        resolve_objects(str(tmp_path / "empty"), options)

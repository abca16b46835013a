"""Cache tiers against a real S3-compatible server: a load reads the fastest tier holding the
object's version and writes none; `fill_tiers()` writes the missing entries afterwards, from
the fastest tier holding them or from the origin, and a fill that fails leaves nothing."""

from __future__ import annotations

import dataclasses
import json
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.s3 import s3_client
from tests.integration.test_loader import assert_bitwise_equal, sample_tensors

URI = "s3://test/tiers2/model.safetensors"


@pytest.fixture
def origin(s3_env: Any, tmp_path: Path) -> Path:
    """The checkpoint, uploaded to URI; the local copy is what every load must return."""
    path = tmp_path / "model.safetensors"
    save_file(sample_tensors(), str(path), metadata={"format": "pt"})
    s3_client().upload_file(str(path), "test", "tiers2/model.safetensors")
    return path


def tier_options(tmp_path: Path, **kw: Any) -> loader.LoadOptions:
    return loader.LoadOptions(
        cache_dir=str(tmp_path / "disk"),
        cache_max_bytes=1 << 30,
        host_cache_dir=str(tmp_path / "host"),
        host_cache_max_bytes=1 << 30,
        **kw,
    )


def files(root: Path) -> list[str]:
    """Everything in a tier directory: entries, sidecars, temp files, anything else."""
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def entries(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


def test_a_miss_writes_no_entry_and_the_fill_makes_the_next_load_a_host_hit(
    origin: Path, tmp_path: Path
) -> None:
    options = tier_options(tmp_path)
    first = loader.load(URI, options=options)
    assert first.metrics.tier_hits == {}
    assert files(tmp_path / "host") == files(tmp_path / "disk") == []
    assert [(j.uri, j.tiers) for j in first.fill.jobs] == [(URI, ("host", "disk"))]

    assert loader.cached_uris(tmp_path / "host") == set()
    report = first.fill_tiers()
    assert report.filled == (("host", URI), ("disk", URI)) and report.failed == {}
    assert loader.cached_uris(tmp_path / "host") == loader.cached_uris(tmp_path / "disk") == {URI}
    assert first.fill_tiers() is report, "idempotent: the second call does nothing"
    for root in (tmp_path / "host", tmp_path / "disk"):
        (entry,) = entries(root)
        assert entry.read_bytes() == origin.read_bytes()

    second = loader.load(URI, options=options)
    assert second.metrics.tier_hits == {"host": 1}
    assert_bitwise_equal(second.tensors, first.tensors)
    assert second.fill.jobs == () and second.fill_tiers().filled == ()


def test_concurrent_fill_calls_write_each_entry_once(origin: Path, tmp_path: Path) -> None:
    result = loader.load(URI, options=tier_options(tmp_path))
    reports: list[loader.FillReport] = []
    threads = [threading.Thread(target=lambda: reports.append(result.fill_tiers())) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reports[0] is reports[1] and len(reports[0].filled) == 2
    assert len(entries(tmp_path / "host")) == 1 and len(files(tmp_path / "host")) == 2


def test_an_object_replaced_after_the_load_is_not_cached(origin: Path, tmp_path: Path) -> None:
    result = loader.load(URI, options=tier_options(tmp_path))
    changed = sample_tensors() | {"f32": torch.zeros(7, 5)}  # same size, new ETag
    save_file(changed, str(tmp_path / "v2.safetensors"), metadata={"format": "pt"})
    s3_client().upload_file(str(tmp_path / "v2.safetensors"), "test", "tiers2/model.safetensors")

    report = result.fill_tiers()
    assert report.filled == () and "ObjectChanged" in report.failed[URI]
    assert files(tmp_path / "host") == files(tmp_path / "disk") == []
    assert_bitwise_equal(result.tensors, load_file(str(origin)))  # the model is untouched


def test_a_disk_hit_refills_the_host_tier_from_the_disk_entry(origin: Path, tmp_path: Path) -> None:
    disk_only = loader.LoadOptions(cache_dir=str(tmp_path / "disk"), cache_max_bytes=1 << 30)
    loader.load(URI, options=disk_only).fill_tiers()
    options = tier_options(tmp_path)
    hit = loader.load(URI, options=options)
    assert hit.metrics.tier_hits == {"disk": 1} and files(tmp_path / "host") == []
    s3_client().delete_object(Bucket="test", Key="tiers2/model.safetensors")  # origin gone
    assert hit.fill_tiers().filled == (("host", URI),)
    assert entries(tmp_path / "host")[0].read_bytes() == origin.read_bytes()


def test_a_disk_entry_evicted_before_the_fill_is_fetched_from_the_origin(
    origin: Path, tmp_path: Path
) -> None:
    disk_only = loader.LoadOptions(cache_dir=str(tmp_path / "disk"), cache_max_bytes=1 << 30)
    loader.load(URI, options=disk_only).fill_tiers()
    hit = loader.load(URI, options=tier_options(tmp_path))
    assert hit.metrics.tier_hits == {"disk": 1}
    entries(tmp_path / "disk")[0].unlink()
    assert hit.fill_tiers().filled == (("host", URI),)
    assert entries(tmp_path / "host")[0].read_bytes() == origin.read_bytes()


def test_skipped_tensors_do_not_keep_an_object_out_of_the_cache(
    origin: Path, tmp_path: Path
) -> None:
    options = tier_options(tmp_path)
    partial = loader.load(URI, options=options, name_map=lambda n: None if n == "f32" else n)
    assert "f32" not in partial.tensors
    assert len(partial.fill_tiers().filled) == 2  # the fill copies the whole object
    full = loader.load(URI, options=options)
    assert full.metrics.tier_hits == {"host": 1}
    assert_bitwise_equal(full.tensors, load_file(str(origin)))


def test_an_object_too_large_for_a_tier_goes_to_the_others(origin: Path, tmp_path: Path) -> None:
    small_host = dataclasses.replace(tier_options(tmp_path), host_cache_max_bytes=16)
    result = loader.load(URI, options=small_host)
    assert result.fill_tiers().filled == (("disk", URI),)
    assert files(tmp_path / "host") == []


# --------------------------------------------------------------------------- host-tier hits


def host_hit(origin: Path, tmp_path: Path, **kw: Any) -> loader.LoadResult:
    options = tier_options(tmp_path)
    loader.load(URI, options=options).fill_tiers()
    result = loader.load(URI, options=options, **kw)
    assert result.metrics.tier_hits == {"host": 1}
    return result


def test_a_host_hit_on_cpu_maps_the_entry_and_writes_stay_private(
    origin: Path, tmp_path: Path
) -> None:
    want = load_file(str(origin))
    seen: dict[str, torch.Tensor] = {}
    progress: list[loader.Progress] = []
    result = host_hit(origin, tmp_path, on_tensor=seen.__setitem__, on_progress=progress.append)
    assert_bitwise_equal(result.tensors, want)
    assert seen.keys() == result.tensors.keys()
    m = result.metrics
    assert m.mapped_bytes == m.bytes_total  # safetensors stores every tensor aligned
    assert progress[-1].bytes_done == progress[-1].bytes_total == m.bytes_total

    (entry,) = entries(tmp_path / "host")
    before = entry.read_bytes()
    for t in result.tensors.values():  # scribble over every tensor
        t.view(-1).view(torch.uint8).fill_(0xA5)
    assert entry.read_bytes() == before, "a write to a tensor never reaches the entry"
    again = loader.load(URI, options=tier_options(tmp_path))
    assert_bitwise_equal(again.tensors, want)


def test_a_misaligned_tensor_is_copied_beside_mapped_ones(s3_env: Any, tmp_path: Path) -> None:
    doc = {
        "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},  # offset 3: misaligned
    }
    raw = json.dumps(doc).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    data = bytes([1, 2, 3]) + struct.pack("<2f", 1.5, -2.0)
    body = struct.pack("<Q", len(raw)) + raw + data
    s3_client().put_object(Bucket="test", Key="tiers2/odd.safetensors", Body=body)
    uri = "s3://test/tiers2/odd.safetensors"
    options = tier_options(tmp_path)
    loader.load(uri, options=options).fill_tiers()
    result = loader.load(uri, options=options)
    assert result.metrics.mapped_bytes == 3 and result.metrics.bytes_total == 11
    assert result.tensors["a"].tolist() == [1, 2, 3]
    assert result.tensors["b"].tolist() == [1.5, -2.0]


def test_a_mapped_model_survives_the_eviction_of_its_entry(origin: Path, tmp_path: Path) -> None:
    result = host_hit(origin, tmp_path)
    assert result.metrics.mapped_bytes > 0
    (entry,) = entries(tmp_path / "host")
    loader.cache.DiskCache(tmp_path / "host", 1 << 30).evict(0)  # LRU eviction: unlinked
    assert not entry.exists() and loader.cached_uris(tmp_path / "host") == set()
    assert_bitwise_equal(result.tensors, load_file(str(origin)))


def test_fused_tensors_stored_apart_are_copied_next_to_mapped_ones(
    s3_env: Any, tmp_path: Path
) -> None:
    """As the worker loads a Llama: gate/up (stored next to each other) stay views of the
    entry; q/k/v (stored k, q, v) are copied into their fused tensor."""
    g = torch.Generator().manual_seed(1)
    stored = {
        f"l.{name}": torch.randn(rows, 64, generator=g).bfloat16()
        for name, rows in [("mlp.gate", 24), ("mlp.up", 24), ("attn.k", 8), ("attn.q", 32)]
    } | {"l.attn.v": torch.randn(8, 64, generator=g).bfloat16()}
    path = tmp_path / "fused.safetensors"
    save_file(stored, str(path))
    s3_client().upload_file(str(path), "test", "tiers2/fused.safetensors")
    uri = "s3://test/tiers2/fused.safetensors"
    fuse = {"q": ("qkv", 0), "k": ("qkv", 1), "v": ("qkv", 2), "gate": ("gu", 0), "up": ("gu", 1)}

    def name_map(n: str) -> loader.Fused:
        target, index = fuse[n.rsplit(".", 1)[1]]
        return loader.Fused(target, index)

    options = tier_options(tmp_path)
    loader.load(uri, options=options).fill_tiers()
    result = loader.load(uri, options=options, name_map=name_map)
    assert result.metrics.tier_hits == {"host": 1}
    assert result.metrics.mapped_bytes == 48 * 64 * 2  # gate + up
    qkv = torch.cat([stored["l.attn.q"], stored["l.attn.k"], stored["l.attn.v"]])
    assert torch.equal(result.tensors["qkv"], qkv)
    assert torch.equal(result.tensors["gu"], torch.cat([stored["l.mlp.gate"], stored["l.mlp.up"]]))


def test_a_disk_hit_and_a_staged_host_hit_are_copies(origin: Path, tmp_path: Path) -> None:
    """A disk entry is never mapped (page cache can be dropped); nor is anything on the staged
    (device) path, shown here with a CPU stand-in for the copy engine."""
    from tests.unit.test_loader_ring import LateCopier

    want = load_file(str(origin))
    options = tier_options(tmp_path)
    loader.load(URI, options=options).fill_tiers()
    staged = loader.load(URI, options=options, copier=LateCopier())
    assert staged.metrics.tier_hits == {"host": 1} and staged.metrics.mapped_bytes == 0
    assert_bitwise_equal(staged.tensors, want)
    entries(tmp_path / "host")[0].unlink()
    disk = loader.load(URI, options=options)
    assert disk.metrics.tier_hits == {"disk": 1} and disk.metrics.mapped_bytes == 0
    assert_bitwise_equal(disk.tensors, want)


@pytest.mark.gpu
def test_a_cuda_load_fills_the_tiers_afterwards_and_reads_them_back(
    origin: Path, tmp_path: Path
) -> None:
    options = tier_options(tmp_path)
    first = loader.load(URI, device="cuda", options=options)
    assert files(tmp_path / "host") == []
    assert len(first.fill_tiers().filled) == 2  # read again: the staging ring kept nothing
    hit = loader.load(URI, device="cuda", options=options)
    assert hit.metrics.tier_hits == {"host": 1} and hit.metrics.mapped_bytes == 0
    assert_bitwise_equal({k: t.cpu() for k, t in hit.tensors.items()}, load_file(str(origin)))

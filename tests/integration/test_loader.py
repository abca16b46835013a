"""Loader output is bitwise equal to `safetensors.torch.load_file`, from local files and from a
real S3-compatible server (`rclone serve s3`); errors are typed and name the URI."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.s3 import s3_client


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(7, 5, generator=g),
        "f16": torch.randn(3, 9, generator=g).half(),
        "bf16": torch.randn(4, 4, generator=g).bfloat16(),
        "i8": torch.randint(-128, 127, (13,), dtype=torch.int8, generator=g),
        "i64": torch.randint(0, 10**9, (3,), generator=g),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "odd": torch.randn(1, 3, generator=g).half(),  # 6 bytes: later offsets become odd
    }


def assert_bitwise_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(
            got[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)
        ), name


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(sample_tensors(), str(path), metadata={"format": "pt"})
    return path


def test_local_file_matches_safetensors(checkpoint: Path) -> None:
    assert_bitwise_equal(loader.load_checkpoint(str(checkpoint)), load_file(str(checkpoint)))
    assert_bitwise_equal(loader.load_checkpoint(f"file://{checkpoint}"), load_file(str(checkpoint)))


def test_s3_matches_safetensors(checkpoint: Path, s3_env: Any) -> None:
    s3_client().upload_file(str(checkpoint), "test", "ckpt/model.safetensors")
    got = loader.load_model_dir("s3://test/ckpt/")
    assert_bitwise_equal(got, load_file(str(checkpoint)))


def test_sharded_checkpoint_from_s3(tmp_path: Path, s3_env: Any) -> None:
    tensors = sample_tensors()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:4],
        "model-00002-of-00002.safetensors": names[4:],
    }
    client = s3_client()
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard))
        client.upload_file(str(tmp_path / shard), "test", f"sharded/{shard}")
    index = {"weight_map": {k: s for s, ks in shards.items() for k in ks}}
    client.put_object(
        Bucket="test", Key="sharded/model.safetensors.index.json", Body=json.dumps(index).encode()
    )
    assert_bitwise_equal(loader.load_model_dir("s3://test/sharded/"), tensors)


def test_missing_objects_are_typed_errors(s3_env: Any, tmp_path: Path) -> None:
    with pytest.raises(
        loader.ObjectNotFound, match=re.escape("s3://test/nothing/model.safetensors")
    ):
        loader.load_model_dir("s3://test/nothing/")
    with pytest.raises(loader.ObjectNotFound):
        loader.load_checkpoint(str(tmp_path / "absent.safetensors"))


def test_wrong_credentials_are_access_denied(
    checkpoint: Path, s3_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_client().upload_file(str(checkpoint), "test", "denied/model.safetensors")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    with pytest.raises(loader.AccessDenied, match=re.escape("s3://test/denied/model.safetensors")):
        loader.load_checkpoint("s3://test/denied/model.safetensors")


def _write_raw(path: Path, header: dict[str, Any], data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_corrupt_headers_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(loader.CorruptCheckpoint, match="header length"):
        loader.load_checkpoint(str(bad))
    bad.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(loader.CorruptCheckpoint, match="not valid JSON"):
        loader.load_checkpoint(str(bad))
    _write_raw(bad, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    with pytest.raises(loader.CorruptCheckpoint, match="'w'"):
        loader.load_checkpoint(str(bad))
    _write_raw(bad, {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16)
    with pytest.raises(loader.CorruptCheckpoint, match="needs 12 bytes"):
        loader.load_checkpoint(str(bad))
    _write_raw(bad, {"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(loader.UnsupportedDtype, match="C64"):
        loader.load_checkpoint(str(bad))


# --------------------------------------------------------------------------- API features


def test_name_map_fuses_renames_and_skips(checkpoint: Path) -> None:
    want = load_file(str(checkpoint))

    def name_map(name: str) -> str | loader.Fused | None:
        if name in ("f32", "i8"):
            return None
        if name == "f16":
            return loader.Fused("f16x2", 0)
        if name == "odd":
            return loader.Fused("f16x2", 1)  # [3, 9] + [1, 3]: trailing dims differ
        return "renamed." + name

    with pytest.raises(ValueError, match="cannot fuse"):
        loader.load(str(checkpoint), name_map=name_map)

    g = torch.Generator().manual_seed(0)
    parts = {
        "q": torch.randn(4, 6, generator=g).half(),
        "k": torch.randn(2, 6, generator=g).half(),
        "mid": torch.randn(5, generator=g),
        "v": torch.randn(2, 6, generator=g).half(),
    }
    path = checkpoint.with_name("qkv.safetensors")
    save_file(parts, str(path))
    order = {"q": 0, "k": 1, "v": 2}
    seen: list[str] = []
    result = loader.load(
        str(path),
        name_map=lambda n: loader.Fused("qkv", order[n]) if n in order else None,
        on_tensor=lambda n, t: seen.append(n),
    )
    assert list(result.tensors) == ["qkv"] and seen == ["qkv"]
    assert torch.equal(result.tensors["qkv"], torch.cat([parts["q"], parts["k"], parts["v"]]))
    renamed = loader.load(str(checkpoint), name_map=lambda n: f"x.{n}").tensors
    assert_bitwise_equal({k[2:]: v for k, v in renamed.items()}, want)


def test_tensors_arrive_before_the_load_returns_and_progress_is_reported(
    checkpoint: Path,
) -> None:
    seen: dict[str, torch.Tensor] = {}
    progress: list[loader.Progress] = []
    options = loader.LoadOptions(part_bytes=64 << 10, first_request_bytes=256)
    result = loader.load(
        str(checkpoint),
        on_tensor=lambda n, t: seen.__setitem__(n, t),
        on_progress=progress.append,
        options=options,
    )
    assert seen.keys() == result.tensors.keys()
    assert all(seen[n] is result.tensors[n] for n in seen)
    assert progress[0].phase == "header" and progress[-1].phase == "done"
    assert progress[-1].bytes_done == progress[-1].bytes_total == result.metrics.bytes_total
    assert progress[-1].tensors_ready == len(result.tensors)
    m = result.metrics
    assert m.seconds > 0 and set(m.phases_s) == {"header", "fetch", "copy", "finish"}
    assert m.num_objects == 1 and m.num_retries == 0


def test_dtype_conversion_touches_floats_only(checkpoint: Path) -> None:
    got = loader.load(str(checkpoint), dtype=torch.float32).tensors
    want = load_file(str(checkpoint))
    assert got["bf16"].dtype == torch.float32 and torch.equal(got["bf16"], want["bf16"].float())
    assert got["i8"].dtype == torch.int8 and got["flag"].dtype == torch.bool


def test_header_longer_than_the_first_request(checkpoint: Path, s3_env: Any) -> None:
    s3_client().upload_file(str(checkpoint), "test", "long/model.safetensors")
    options = loader.LoadOptions(first_request_bytes=100, part_bytes=64 << 10)
    got = loader.load("s3://test/long/model.safetensors", options=options).tensors
    assert_bitwise_equal(got, load_file(str(checkpoint)))


def test_prefix_without_index_loads_every_safetensors_object(tmp_path: Path, s3_env: Any) -> None:
    tensors = sample_tensors()
    names = sorted(tensors)
    client = s3_client()
    for i, chunk in enumerate((names[:5], names[5:])):
        path = tmp_path / f"part{i}.safetensors"
        save_file({k: tensors[k] for k in chunk}, str(path))
        client.upload_file(str(path), "test", f"noindex/part{i}.safetensors")
    client.put_object(Bucket="test", Key="noindex/config.json", Body=b"{}")
    assert_bitwise_equal(loader.load_model_dir("s3://test/noindex/"), tensors)
    with pytest.raises(loader.ObjectNotFound, match="found: nothing"):
        loader.load_model_dir("s3://test/empty-prefix/")


def test_local_sharded_directory(tmp_path: Path) -> None:
    tensors = sample_tensors()
    names = sorted(tensors)
    shards = {"a.safetensors": names[:3], "b.safetensors": names[3:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard))
    index = {"weight_map": {k: s for s, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_bitwise_equal(loader.load_model_dir(str(tmp_path)), tensors)
    index["weight_map"]["ghost"] = "a.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(loader.CorruptCheckpoint, match="ghost"):
        loader.load_model_dir(str(tmp_path))


def test_cache_tier_serves_the_same_version_and_misses_a_new_one(
    checkpoint: Path, s3_env: Any, tmp_path: Path
) -> None:
    s3_client().upload_file(str(checkpoint), "test", "cached/model.safetensors")
    options = loader.LoadOptions(cache_dir=str(tmp_path / "cache"), cache_max_bytes=1 << 30)
    uri = "s3://test/cached/model.safetensors"
    first = loader.load(uri, options=options)
    assert first.metrics.cache_hits == 0
    assert not list((tmp_path / "cache").glob("*.safetensors")), "filled after the load"
    assert first.fill_tiers().filled == (("disk", uri),)
    entries = list((tmp_path / "cache").glob("*.safetensors"))
    assert len(entries) == 1 and entries[0].read_bytes() == checkpoint.read_bytes()
    second = loader.load(uri, options=options)
    assert second.metrics.cache_hits == 1
    assert_bitwise_equal(second.tensors, load_file(str(checkpoint)))
    changed = sample_tensors() | {"f32": torch.zeros(7, 5)}
    save_file(changed, str(tmp_path / "v2.safetensors"))
    s3_client().upload_file(str(tmp_path / "v2.safetensors"), "test", "cached/model.safetensors")
    third = loader.load(uri, options=options)
    assert third.metrics.cache_hits == 0
    assert_bitwise_equal(third.tensors, changed)
    third.fill_tiers()
    assert loader.load(uri, options=options).metrics.cache_hits == 1


def test_host_memory_tier_in_front_of_the_disk_tier(
    checkpoint: Path, s3_env: Any, tmp_path: Path
) -> None:
    """The fastest tier holding the version serves it; filling after a miss writes both, after
    a disk hit the host tier; a tier too small for the object is skipped; a new version misses
    both."""
    s3_client().upload_file(str(checkpoint), "test", "tiers/model.safetensors")
    uri = "s3://test/tiers/model.safetensors"
    host, disk = tmp_path / "shm", tmp_path / "disk"
    options = loader.LoadOptions(
        cache_dir=str(disk),
        cache_max_bytes=1 << 30,
        host_cache_dir=str(host),
        host_cache_max_bytes=1 << 30,
    )
    want = load_file(str(checkpoint))

    def entries(root: Path) -> list[Path]:
        return sorted(root.glob("*.safetensors"))

    first = loader.load(uri, options=options)
    assert (first.metrics.cache_hits, first.metrics.tier_hits) == (0, {})
    assert entries(host) == entries(disk) == []
    assert first.fill_tiers().filled == (("host", uri), ("disk", uri))
    for root in (host, disk):  # filled from the origin, byte for byte
        (entry,) = entries(root)
        assert entry.read_bytes() == checkpoint.read_bytes()
    second = loader.load(uri, options=options)
    assert second.metrics.tier_hits == {"host": 1}
    assert_bitwise_equal(second.tensors, want)

    entries(host)[0].unlink()  # evicted from host memory (or the host restarted)
    third = loader.load(uri, options=options)
    assert third.metrics.tier_hits == {"disk": 1}
    assert_bitwise_equal(third.tensors, want)
    assert entries(host) == []
    assert third.fill_tiers().filled == (("host", uri),)
    assert entries(host)[0].read_bytes() == checkpoint.read_bytes(), "the disk hit refilled it"
    assert loader.load(uri, options=options).metrics.tier_hits == {"host": 1}

    # a host tier too small for the object: the disk tier alone serves
    small = dataclasses.replace(
        options, host_cache_dir=str(tmp_path / "tiny"), host_cache_max_bytes=16
    )
    tiny = loader.load(uri, options=small)
    assert tiny.metrics.tier_hits == {"disk": 1}
    assert tiny.fill_tiers().filled == () and entries(tmp_path / "tiny") == []

    changed = sample_tensors() | {"f32": torch.ones(7, 5)}
    save_file(changed, str(tmp_path / "v2.safetensors"))
    s3_client().upload_file(str(tmp_path / "v2.safetensors"), "test", "tiers/model.safetensors")
    fresh = loader.load(uri, options=options)
    assert fresh.metrics.tier_hits == {}
    assert_bitwise_equal(fresh.tensors, changed)
    fresh.fill_tiers()
    assert loader.load(uri, options=options).metrics.tier_hits == {"host": 1}


def test_read_bytes_and_exists(s3_env: Any, tmp_path: Path) -> None:
    s3_client().put_object(Bucket="test", Key="small/config.json", Body=b'{"a": 1}')
    assert loader.read_bytes("s3://test/small/config.json") == b'{"a": 1}'
    assert loader.exists("s3://test/small/config.json")
    assert not loader.exists("s3://test/small/absent.json")
    with pytest.raises(loader.ObjectNotFound):
        loader.read_bytes("s3://test/small/absent.json")
    (tmp_path / "f").write_bytes(b"x")
    assert loader.read_bytes(str(tmp_path / "f")) == b"x" and loader.exists(str(tmp_path / "f"))

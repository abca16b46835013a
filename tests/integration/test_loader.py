"""Loader output is bitwise equal to `safetensors.torch.load_file`, from local files and from a
real S3-compatible server (`rclone serve s3`); errors are typed and name the URI."""

from __future__ import annotations

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

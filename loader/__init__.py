"""Weight loader: URI in, named tensors out. Knows nothing of models or the platform.

>>> from loader import load_checkpoint
>>> tensors = load_checkpoint("s3://models/demo/model.safetensors")
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from loader.errors import (
    AccessDenied,
    CorruptCheckpoint,
    FetchError,
    LoaderError,
    ObjectNotFound,
    UnsupportedDtype,
)
from loader.safetensors_reader import load_safetensors
from loader.sources import S3Options, exists, join_uri, open_source, read_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "AccessDenied",
    "CorruptCheckpoint",
    "FetchError",
    "LoaderError",
    "ObjectNotFound",
    "S3Options",
    "UnsupportedDtype",
    "exists",
    "join_uri",
    "load_checkpoint",
    "load_model_dir",
    "read_bytes",
]


def load_checkpoint(uri: str, s3: S3Options | None = None) -> dict[str, torch.Tensor]:
    """Tensors of one safetensors object."""
    return load_safetensors(uri, open_source(uri, s3))


def load_model_dir(uri: str, s3: S3Options | None = None) -> dict[str, torch.Tensor]:
    """Tensors of a model directory: `model.safetensors`, or the shards its index names."""
    index_uri = join_uri(uri, "model.safetensors.index.json")
    if not exists(index_uri, s3):
        return load_checkpoint(join_uri(uri, "model.safetensors"), s3)
    try:
        weight_map: dict[str, str] = json.loads(read_bytes(index_uri, s3))["weight_map"]
    except (KeyError, ValueError) as exc:
        raise CorruptCheckpoint(index_uri, f"unreadable shard index: {exc}") from exc
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(load_checkpoint(join_uri(uri, shard), s3))
    missing = set(weight_map) - set(tensors)
    if missing:
        raise CorruptCheckpoint(index_uri, f"{len(missing)} tensors named in the index are absent")
    return tensors

"""Weight loader: URI in, named tensors out. Knows nothing of models or the platform.

>>> import loader
>>> tensors = loader.load_model_dir("s3://models/demo/", device="cuda")
>>> result = loader.load("hf://org/repo@main/", on_progress=print)  # tensors + metrics
>>> result.fill_tiers()  # then, off the critical path: write the cache tiers it missed

Sources: `s3://bucket/key-or-prefix`, `hf://org/repo[@revision][/path]`, `file://` and local
paths; a `.safetensors` object, a `model.safetensors.index.json`, or a directory holding one.
Errors are `LoaderError` subclasses (`loader.errors`); a load that raises returns nothing.
`cached_uris(dir)` lists the objects a cache tier holds (placement's locality signal).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from loader.cache import cached_uris
from loader.checkpoint import LoadResult, load
from loader.errors import (
    AccessDenied,
    CorruptCheckpoint,
    FetchError,
    LoaderError,
    ObjectChanged,
    ObjectNotFound,
    UnsupportedDtype,
)
from loader.fill import FillReport, TierFill
from loader.options import (
    Fused,
    LoadMetrics,
    LoadOptions,
    NameMap,
    Progress,
    S3Options,
)
from loader.s3 import preload
from loader.sources import ObjectStore, exists, join_uri, read_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "AccessDenied",
    "CorruptCheckpoint",
    "FetchError",
    "FillReport",
    "Fused",
    "LoadMetrics",
    "LoadOptions",
    "LoadResult",
    "LoaderError",
    "NameMap",
    "ObjectChanged",
    "ObjectNotFound",
    "ObjectStore",
    "Progress",
    "S3Options",
    "TierFill",
    "UnsupportedDtype",
    "cached_uris",
    "exists",
    "join_uri",
    "load",
    "load_checkpoint",
    "load_model_dir",
    "preload",
    "read_bytes",
]


def _with_s3(kwargs: dict[str, Any], s3: S3Options | None) -> dict[str, Any]:
    if s3 is not None:
        kwargs["options"] = replace(kwargs.get("options") or LoadOptions(), s3=s3)
    return kwargs


def load_checkpoint(
    uri: str, s3: S3Options | None = None, **kwargs: Any
) -> dict[str, torch.Tensor]:
    """Tensors of one safetensors object; keyword arguments as for `load`."""
    return load(uri, **_with_s3(kwargs, s3)).tensors


def load_model_dir(uri: str, s3: S3Options | None = None, **kwargs: Any) -> dict[str, torch.Tensor]:
    """Tensors of a model directory: `model.safetensors`, or the shards its index names."""
    return load(uri, **_with_s3(kwargs, s3)).tensors

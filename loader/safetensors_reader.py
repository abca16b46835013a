"""Parse a safetensors file from any `Source` into named tensors, with one allocation.

Layout: 8-byte little-endian header length N, N bytes of JSON header, then the data section.
The data section is received straight into one uint8 buffer and every tensor is a zero-copy
view of it (issue #3 replaces this with concurrent ranged GETs and a CUDA staging ring).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader.errors import CorruptCheckpoint, UnsupportedDtype
from loader.sources import Source

if TYPE_CHECKING:
    import torch

# Refuse absurd headers before allocating for them.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# Receive size per ranged GET: large enough to amortise request cost.
PART_BYTES = 16 * 1024 * 1024

_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str  # tensor name in the checkpoint
    dtype: str  # safetensors dtype code (F32, BF16, ...)
    shape: tuple[int, ...]  # tensor shape
    start: int  # byte offset in the data section (inclusive)
    end: int  # byte offset in the data section (exclusive)


def parse_header(uri: str, source: Source) -> tuple[int, list[TensorEntry], dict[str, str]]:
    """Return (data section offset, tensor entries, metadata)."""
    size = source.size()
    if size < 8:
        raise CorruptCheckpoint(uri, f"file is {size} bytes; too small for a safetensors header")
    (header_len,) = struct.unpack("<Q", source.read_range(0, 8))
    if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
        raise CorruptCheckpoint(uri, f"header length {header_len} does not fit the file ({size})")
    try:
        header: dict[str, Any] = json.loads(source.read_range(8, header_len))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpoint(uri, f"header is not valid JSON: {exc}") from exc
    metadata = header.pop("__metadata__", None) or {}
    data_offset = 8 + header_len
    data_len = size - data_offset
    entries = []
    for name, info in header.items():
        try:
            dtype = info["dtype"]
            shape = tuple(int(d) for d in info["shape"])
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptCheckpoint(uri, f"malformed entry: {exc}", tensor=name) from exc
        if dtype not in _DTYPES:
            raise UnsupportedDtype(uri, f"dtype {dtype} is not supported", tensor=name)
        if not 0 <= start <= end <= data_len:
            raise CorruptCheckpoint(
                uri, f"data offsets {start}..{end} outside the data section ({data_len})", name
            )
        entries.append(TensorEntry(name, dtype, shape, start, end))
    return data_offset, entries, metadata


def load_safetensors(uri: str, source: Source) -> dict[str, torch.Tensor]:
    """Load every tensor of one safetensors object onto the CPU."""
    import torch

    data_offset, entries, _ = parse_header(uri, source)
    data_len = source.size() - data_offset
    buffer = torch.empty(data_len, dtype=torch.uint8)
    view = buffer.numpy().data.cast("B")
    for part_start in range(0, data_len, PART_BYTES):
        part_end = min(part_start + PART_BYTES, data_len)
        source.read_range_into(data_offset + part_start, view[part_start:part_end])
    tensors: dict[str, torch.Tensor] = {}
    for e in entries:
        dtype = getattr(torch, _DTYPES[e.dtype])
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for d in e.shape:
            numel *= d
        if numel * itemsize != e.end - e.start:
            raise CorruptCheckpoint(
                uri,
                f"shape {list(e.shape)} needs {numel * itemsize} bytes, has {e.end - e.start}",
                e.name,
            )
        raw = buffer[e.start : e.end]
        # Views need aligned offsets; an odd offset gets a copy (rare: writers align to 8).
        if e.start % itemsize:
            raw = raw.clone()
        tensors[e.name] = raw.view(dtype).reshape(e.shape)
    return tensors

"""Parse and validate a safetensors header (pure: bytes in, entries out).

Layout of a safetensors object: 8-byte little-endian header length N, N bytes of JSON header,
then the data section. Every tensor names `[start, end)` offsets in the data section; the
format requires the entries to tile the data section exactly (no holes, no overlaps), which
is checked here together with the object size, so a truncated or padded object is refused
before a single data byte is fetched.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from loader.errors import CorruptCheckpoint, UnsupportedDtype

# Refuse absurd headers before allocating for them (the reference implementation caps at 100 MB).
MAX_HEADER_BYTES = 100_000_000
HEADER_PREFIX_BYTES = 8

# safetensors dtype code → (torch dtype name, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str  # tensor name in the checkpoint
    dtype: str  # safetensors dtype code (F32, BF16, ...)
    shape: tuple[int, ...]  # tensor shape
    start: int  # byte offset in the data section (inclusive)
    end: int  # byte offset in the data section (exclusive)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def size_bytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Header:
    data_offset: int  # object offset of the data section: 8 + N
    data_size: int  # bytes in the data section (object size - data_offset)
    entries: tuple[TensorEntry, ...]  # sorted by start offset
    metadata: dict[str, str]  # the free-form `__metadata__` map


def header_length(uri: str, prefix: bytes | bytearray | memoryview, object_size: int) -> int:
    """N from the first 8 bytes, checked against the object size."""
    if object_size < HEADER_PREFIX_BYTES or len(prefix) < HEADER_PREFIX_BYTES:
        raise CorruptCheckpoint(
            uri, f"object is {object_size} bytes; too small for a safetensors header"
        )
    (n,) = struct.unpack("<Q", bytes(prefix[:HEADER_PREFIX_BYTES]))
    if n > MAX_HEADER_BYTES or HEADER_PREFIX_BYTES + n > object_size:
        raise CorruptCheckpoint(
            uri,
            f"header length {n} does not fit the object ({object_size} bytes): "
            "not a safetensors file, or a truncated upload",
        )
    return int(n)


def parse_header(uri: str, raw: bytes | bytearray | memoryview, object_size: int) -> Header:
    """Validate the JSON header `raw` (without the 8-byte prefix) of an object of `object_size`."""
    data_offset = HEADER_PREFIX_BYTES + len(raw)
    data_size = object_size - data_offset
    try:
        doc: Any = json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        # RecursionError: nesting deeper than the parser's stack (a crafted header)
        raise CorruptCheckpoint(uri, f"header is not valid JSON: {type(exc).__name__}") from None
    if not isinstance(doc, dict):
        raise CorruptCheckpoint(uri, "header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    entries = sorted((_entry(uri, name, info) for name, info in doc.items()), key=_order)
    position = 0
    for e in entries:
        if e.end > data_size:
            raise CorruptCheckpoint(
                uri,
                f"data offsets {e.start}..{e.end} are outside the data section ({data_size} "
                "bytes): the object is truncated or its header is corrupt",
                e.name,
            )
        if e.start != position:
            what = "overlaps the previous tensor" if e.start < position else "leaves a hole"
            raise CorruptCheckpoint(uri, f"data offsets {e.start}..{e.end} {what}", e.name)
        position = e.end
    if position != data_size:
        raise CorruptCheckpoint(
            uri,
            f"the header describes {position} data bytes but the object has {data_size}: "
            "re-upload the checkpoint",
        )
    return Header(data_offset, data_size, tuple(entries), dict(metadata))


def _order(e: TensorEntry) -> tuple[int, int]:
    return (e.start, e.end)


def _entry(uri: str, name: str, info: Any) -> TensorEntry:
    try:
        dtype = str(info["dtype"])
        shape = tuple(int(d) for d in info["shape"])
        start, end = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpoint(uri, f"malformed header entry: {exc!r}", name) from exc
    if dtype not in DTYPES:
        raise UnsupportedDtype(
            uri, f"dtype {dtype} is not supported (supported: {', '.join(DTYPES)})", name
        )
    if any(d < 0 for d in shape) or not 0 <= start <= end:
        raise CorruptCheckpoint(uri, f"negative shape or offsets {shape} {start}..{end}", name)
    numel = 1
    for d in shape:
        numel *= d
    if numel * DTYPES[dtype][1] != end - start:
        raise CorruptCheckpoint(
            uri,
            f"shape {list(shape)} of {dtype} needs {numel * DTYPES[dtype][1]} bytes, "
            f"the offsets give {end - start}",
            name,
        )
    return TensorEntry(name, dtype, shape, start, end)

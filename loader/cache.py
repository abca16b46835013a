"""Local cache tiers: write-through copies of remote objects, keyed by URI and version.

Two tiers of the same kind, fastest first (`cache_tiers`): host memory (a directory on a tmpfs
such as /dev/shm: entries outlive the worker that loaded them, a hit is a memory copy) and
local disk. A load reads an object from the fastest tier holding that exact version, and writes
it through to every faster tier that lacks it (a disk hit fills the host tier).

An entry is a complete copy of one object (a valid safetensors file), named by a hash of
(uri, ETag, size), written while the object streams in and renamed into place only after the
load succeeded, so a reader never sees a partial entry. A hit refreshes the entry's mtime;
before writing, entries are evicted oldest-mtime first until the new one fits under the cap.

>>> cache = DiskCache("/var/cache/weights", max_bytes=200 << 30)
>>> cache.lookup("s3://m/model.safetensors", ObjectInfo(size, etag))  # Path or None
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loader.http import ObjectInfo
from loader.options import LoadOptions
from loader.sinks import Chunk

_SUFFIX = ".safetensors"


class CacheWriter:
    """Receives an object's bytes at their offsets (any order, any thread) into a temp file."""

    def __init__(self, final: Path, size: int) -> None:
        self.final = final
        self.tmp = _partial_path(final)
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self.fd, size)

    def write(self, offset: int, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while len(view):
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def write_chunks(self, offset: int, chunks: list[Chunk]) -> None:
        for c in chunks:
            if isinstance(c, int):
                offset += c  # never happens for cached loads: they fetch every byte
            else:
                self.write(offset, c)
                offset += len(c)

    def commit(self) -> None:
        os.close(self.fd)
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        os.close(self.fd)
        self.tmp.unlink(missing_ok=True)


class DiskCache:
    def __init__(self, root: str | Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, uri: str, info: ObjectInfo) -> Path:
        key = hashlib.sha256(f"{uri}\0{info.etag}\0{info.size}".encode()).hexdigest()[:32]
        return self.root / f"{key}{_SUFFIX}"

    def lookup(self, uri: str, info: ObjectInfo) -> Path | None:
        """The entry for this version of the object, if complete; refreshes its LRU time."""
        if not info.etag:
            return None  # no version to key on: never serve a possibly stale copy
        path = self.path_for(uri, info)
        try:
            if path.stat().st_size != info.size:
                return None
            os.utime(path)
        except FileNotFoundError:
            return None
        return path

    def writer(self, uri: str, info: ObjectInfo) -> CacheWriter | None:
        """A writer for a new entry, after evicting to make room; None if it can never fit."""
        final = self._make_room(uri, info)
        return CacheWriter(final, info.size) if final is not None else None

    def _make_room(self, uri: str, info: ObjectInfo) -> Path | None:
        """Evict until a new entry for `uri` fits; its path, or None if it can never fit."""
        if not info.etag or info.size > self.max_bytes:
            return None
        self.evict(self.max_bytes - info.size)
        return self.path_for(uri, info)

    def fill(self, uri: str, info: ObjectInfo, download: Callable[[Path], None]) -> Path | None:
        """A new entry written whole by `download(tmp_path)`; None if it can never fit.

        The entry appears (atomically) only once `download` returned; if it raises, the
        partial file is removed and the error propagates.
        """
        final = self._make_room(uri, info)
        if final is None:
            return None
        tmp = _partial_path(final)
        try:
            download(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, final)
        return final

    def entries(self) -> list[tuple[float, int, Path]]:
        out = []
        for p in self.root.glob(f"*{_SUFFIX}"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, st.st_size, p))
        return sorted(out)

    def evict(self, keep_bytes: int) -> None:
        """Remove least recently used entries until at most `keep_bytes` remain."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= keep_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size


@dataclass(frozen=True, slots=True)
class Tier:
    name: str  # "host" | "disk": how metrics and logs name it
    cache: DiskCache


def cache_tiers(options: LoadOptions) -> list[Tier]:
    """The tiers `options` turns on, fastest first."""
    tiers = []
    if options.host_cache_dir and options.host_cache_max_bytes > 0:
        tiers.append(Tier("host", DiskCache(options.host_cache_dir, options.host_cache_max_bytes)))
    if options.cache_dir:
        tiers.append(Tier("disk", DiskCache(options.cache_dir, options.cache_max_bytes)))
    return tiers


class EntryWriter(Protocol):
    def write(self, offset: int, data: memoryview | bytes) -> None: ...
    def write_chunks(self, offset: int, chunks: list[Chunk]) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


class FanOutWriter:
    """One object's bytes written to new entries of several tiers at once."""

    def __init__(self, writers: Sequence[CacheWriter]) -> None:
        self.writers = list(writers)

    def write(self, offset: int, data: memoryview | bytes) -> None:
        for w in self.writers:
            w.write(offset, data)

    def write_chunks(self, offset: int, chunks: list[Chunk]) -> None:
        for w in self.writers:
            w.write_chunks(offset, chunks)

    def commit(self) -> None:
        for w in self.writers:
            w.commit()

    def abort(self) -> None:
        for w in self.writers:
            w.abort()


def _partial_path(final: Path) -> Path:
    """Where an entry is written before it is renamed into place (unique per thread)."""
    return final.with_name(f"{final.name}.{os.getpid()}.{threading.get_ident()}.partial")

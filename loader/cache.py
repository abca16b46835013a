"""Local cache tiers: copies of remote objects, keyed by URI and version.

Two tiers of the same kind, fastest first (`cache_tiers`): host memory (a directory on a tmpfs
such as /dev/shm: entries outlive the worker that loaded them, and a hit on CPU maps the entry
instead of copying it, see `loader.arena.map_entry`) and local disk. A load reads an object from
the fastest tier holding that exact version; it writes no entry itself. Filling the tiers that
lack the object is a separate step the caller runs afterwards (`loader.fill`).

An entry is a complete copy of one object (a valid safetensors file), named by a hash of
(uri, ETag, size), with a sidecar `<hash>.json` naming that version (`cached_uris` lists a tier
from them). It is written to a temporary file, checked, and only then renamed into place, its
sidecar first, so a reader never sees a partial entry; temporary files of writers that died are
swept before the next entry is written. A hit refreshes the entry's mtime; before writing,
entries (and their sidecars) are evicted oldest-mtime first until the new one fits the cap.

NOTE: an entry is never modified once in place (a new one is renamed over it), so an open
descriptor or a mapping of it reads one version, even after it is evicted. An evicted entry
that a worker still maps keeps its memory until that worker exits: the cap bounds what the
tier lists, not what running workers hold.

>>> cache = DiskCache("/var/cache/weights", max_bytes=200 << 30)
>>> cache.lookup("s3://m/model.safetensors", ObjectInfo(size, etag))  # Path or None
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loader.http import ObjectInfo
from loader.options import LoadOptions

_SUFFIX = ".safetensors"
_SIDECAR = ".json"  # next to each entry: {"uri", "etag", "size"}
_PARTIAL = ".partial"
# A temporary file whose writer is gone (or that nobody wrote to for an hour) is removed
# before new entries are written; a live writer's file is never older than its last write.
STALE_PARTIAL_S = 60.0
ABANDONED_PARTIAL_S = 3600.0


class CacheWriter:
    """Receives an object's bytes at their offsets (any order, any thread) into a temp file."""

    def __init__(self, final: Path, size: int, sidecar: bytes) -> None:
        self.final = final
        self.sidecar = sidecar  # the entry's sidecar, written just before it is renamed
        self.tmp = _partial_path(final)
        self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self.fd, size)
        self._closed = False

    def write(self, offset: int, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while len(view):
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def read(self, offset: int, size: int) -> bytes:
        """Bytes written so far at `offset` (the checks before commit)."""
        return os.pread(self.fd, size, offset)

    def commit(self) -> None:
        """Rename the entry into place; FileNotFoundError if it was discarded meanwhile."""
        self._close()
        _write_sidecar(self.final, self.sidecar)
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        self._close()
        self.discard()

    def discard(self) -> None:
        """Remove the temp file (any thread; the writing thread's commit then fails)."""
        self.tmp.unlink(missing_ok=True)

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.fd)


class DiskCache:
    def __init__(self, root: str | Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, uri: str, info: ObjectInfo) -> Path:
        return self.root / f"{_key(uri, info)}{_SUFFIX}"

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
        if not path.with_suffix(_SIDECAR).exists():  # an entry from before sidecars existed
            with contextlib.suppress(OSError):
                _write_sidecar(path, _sidecar(uri, info))
        return path

    def writer(self, uri: str, info: ObjectInfo) -> CacheWriter | None:
        """A writer for a new entry, after evicting to make room; None if it can never fit."""
        final = self._make_room(uri, info)
        return CacheWriter(final, info.size, _sidecar(uri, info)) if final is not None else None

    def _make_room(self, uri: str, info: ObjectInfo) -> Path | None:
        """Evict until a new entry for `uri` fits; its path, or None if it can never fit."""
        if not info.etag or info.size > self.max_bytes:
            return None
        self.sweep_partials()
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
        _write_sidecar(final, _sidecar(uri, info))
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
            path.with_suffix(_SIDECAR).unlink(missing_ok=True)
            total -= size

    def sweep_partials(self, now: float | None = None) -> None:
        """Remove temp files left by writers that died (a killed process, a daemon thread cut
        off at exit): their process is gone, or nothing was written for an hour; and sidecars
        whose entry is gone (a writer died between the two renames, or a hand-deleted entry)."""
        now = time.time() if now is None else now
        for p in self.root.glob(f"*{_PARTIAL}"):
            age = _age(p, now)
            pid = _partial_pid(p)
            if age > ABANDONED_PARTIAL_S or (age > STALE_PARTIAL_S and not _alive(pid)):
                p.unlink(missing_ok=True)
        for p in self.root.glob(f"*{_SIDECAR}"):
            if _age(p, now) > STALE_PARTIAL_S and not p.with_suffix(_SUFFIX).exists():
                p.unlink(missing_ok=True)


def cached_uris(cache_dir: str | Path) -> set[str]:
    """The object URIs a tier directory holds complete entries of (any version), from their
    sidecars; entries without one (written before sidecars existed) are not listed. Cheap:
    one directory listing and one small read per entry; never creates the directory.

    >>> cached_uris("/dev/shm/platform-weights")
    {'s3://models/llama/model-00001-of-00002.safetensors', ...}
    """
    root = Path(cache_dir)
    if not root.is_dir():
        return set()
    uris = set()
    for entry in root.glob(f"*{_SUFFIX}"):
        try:
            doc = json.loads(entry.with_suffix(_SIDECAR).read_bytes())
            uri, info = str(doc["uri"]), ObjectInfo(int(doc["size"]), str(doc["etag"]))
            complete = entry.stat().st_size == info.size
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no sidecar, being evicted, or not ours
        if complete and _key(uri, info) == entry.name.removesuffix(_SUFFIX):
            uris.add(uri)
    return uris


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


class FanOutWriter:
    """One object's bytes written to new entries of several tiers at once."""

    def __init__(self, writers: Sequence[CacheWriter]) -> None:
        assert writers, "at least one entry"
        self.writers = list(writers)

    def write(self, offset: int, data: memoryview | bytes) -> None:
        for w in self.writers:
            w.write(offset, data)

    def read(self, offset: int, size: int) -> list[bytes]:
        """What each entry holds at `offset`."""
        return [w.read(offset, size) for w in self.writers]

    def commit(self) -> None:
        """Rename every entry into place; if one fails, the rest are removed."""
        for i, w in enumerate(self.writers):
            try:
                w.commit()
            except BaseException:
                for rest in self.writers[i:]:
                    rest.abort()
                raise

    def abort(self) -> None:
        for w in self.writers:
            w.abort()

    def discard(self) -> None:
        for w in self.writers:
            w.discard()


def _key(uri: str, info: ObjectInfo) -> str:
    return hashlib.sha256(f"{uri}\0{info.etag}\0{info.size}".encode()).hexdigest()[:32]


def _sidecar(uri: str, info: ObjectInfo) -> bytes:
    return json.dumps({"uri": uri, "etag": info.etag, "size": info.size}).encode()


def _write_sidecar(final: Path, content: bytes) -> None:
    """`<entry>.json`, atomically (temp file, rename): before the entry itself appears."""
    path = final.with_suffix(_SIDECAR)
    tmp = _partial_path(path)
    try:
        tmp.write_bytes(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0  # gone already


def _host() -> str:
    """This host's name as one file-name part (a cache on a volume several pods mount: each
    worker container is its pod's PID 1, so a pid alone does not tell writers apart)."""
    return "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname())[:63]


def _partial_path(final: Path) -> Path:
    """Where an entry is written before it is renamed into place (unique per thread of a
    process of a host): `<entry>.<pid>.<thread>.<host>.partial`."""
    name = f"{final.name}.{os.getpid()}.{threading.get_ident()}.{_host()}{_PARTIAL}"
    return final.with_name(name)


def _partial_pid(path: Path) -> int:
    """The writer's process id from a temp file's name when it is of this host; 0 when of
    another (its process cannot be looked at: left to the abandoned rule); -1 unreadable."""
    parts = path.name.split(".")
    for pid_at, host in ((-4, parts[-2] if len(parts) > 1 else ""), (-3, _host())):
        try:  # `<entry>.<pid>.<thread>.<host>.partial`, or the older `<entry>.<pid>.<thread>`
            pid = int(parts[pid_at])
            int(parts[pid_at + 1])
        except (IndexError, ValueError):
            continue
        return pid if host == _host() else 0
    return -1


def _alive(pid: int) -> bool:
    if pid == 0:
        return True  # another host's writer: only its silence tells (ABANDONED_PARTIAL_S)
    if pid < 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True

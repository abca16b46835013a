"""Byte sources behind one protocol: local files, S3-compatible storage, the Hugging Face Hub.

`open_source(uri)` picks the implementation by scheme:

- `/path`, `relative/path`, `file:///path`: a local file (`LocalSource`, `pread` into memory)
- `s3://bucket/key`: any S3-compatible endpoint (`loader.s3.S3Source`)
- `hf://org/repo[@revision]/file`: the Hugging Face Hub or `HF_ENDPOINT` (`loader.hf.HfSource`)

A source serves validated byte ranges (`open_range`) of one object version; directories and
prefixes are resolved by `loader.objects`. An `ObjectStore` opens sources for one caller and
shares what they have in common (S3 credentials) between them; `open_source`, `read_bytes` and
`exists` are one-shot stores.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from stat import S_ISDIR
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlparse

from loader.errors import FetchError, LoaderError, ObjectChanged, ObjectNotFound
from loader.http import ObjectInfo
from loader.options import S3Options

if TYPE_CHECKING:
    from loader.s3 import S3Endpoint


class Body(Protocol):
    """Consecutive bytes `[pos, end)` of one object, being received."""

    pos: int  # object offset of the next byte
    end: int  # object offset after the last byte

    def readinto(self, out: memoryview) -> int:
        """Fill `out` completely; raises `loader.http.Retryable` on a transient failure."""
        ...

    def skip_to(self, offset: int, scratch: memoryview) -> None: ...

    def close(self) -> None: ...


class Source(Protocol):
    """Read access to one object (a file, an S3 key, a Hub file)."""

    uri: str  # what error messages name
    remote: bool  # worth caching locally

    def stat(self) -> ObjectInfo: ...

    def open_range(
        self,
        start: int,
        end: int,
        pin: ObjectInfo | None,
        timeout_s: float,
        allow_skip: bool = False,
    ) -> tuple[ObjectInfo, Body]:
        """Bytes `[start, end)` (end clipped to the size) of the version `pin` (None: any)."""
        ...

    def read_all(self) -> bytes: ...

    def list_names(self) -> list[str]:
        """Names of the objects beside this one (same directory or prefix), for messages."""
        ...


def join_uri(base: str, name: str) -> str:
    """`s3://b/models/demo/` + `config.json` → `s3://b/models/demo/config.json`."""
    return base.rstrip("/") + "/" + name


def is_local(uri: str) -> bool:
    return uri.startswith("file://") or uri.startswith("/") or not urlparse(uri).scheme


def local_path(uri: str) -> Path:
    return Path(uri[len("file://") :] if uri.startswith("file://") else uri)


class LocalBody:
    def __init__(self, source: LocalSource, pos: int, end: int) -> None:
        self._source = source
        self.pos = pos
        self.end = end

    def readinto(self, out: memoryview) -> int:
        want = len(out)
        if self.pos + want > self.end:
            raise ValueError("read past the end of the range")
        got = 0
        while got < want:
            n = os.preadv(self._source.fd, [out[got:]], self.pos + got)
            if not n:
                raise ObjectChanged(self._source.uri, "the file shrank while loading; load again")
            got += n
        self.pos += got
        return got

    def skip_to(self, offset: int, scratch: memoryview) -> None:
        self.pos = max(self.pos, offset)

    def close(self) -> None:
        pass


class LocalSource:
    """A local file read with `pread` (no shared file position: safe from many threads).

    `entry`: the file is a cache tier's entry, which is never rewritten in place (a new one is
    renamed over it), so the open descriptor is the version; its mtime is the tier's LRU clock
    and changes under concurrent lookups, so it is no part of the version.
    """

    remote = False

    def __init__(self, uri: str, path: Path | None = None, entry: bool = False) -> None:
        self.uri = uri
        self.path = path or local_path(uri)
        self.entry = entry
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise ObjectNotFound(uri, "no such file") from None
        except IsADirectoryError:
            raise ObjectNotFound(uri, "is a directory, not a file") from None
        except PermissionError as exc:
            from loader.errors import AccessDenied

            raise AccessDenied(uri, f"cannot read the file: {exc.strerror}") from None
        if S_ISDIR(os.fstat(self.fd).st_mode):  # open(2) accepts a directory read-only
            self.close()
            raise ObjectNotFound(uri, "is a directory, not a file")

    def stat(self) -> ObjectInfo:
        st = os.fstat(self.fd)
        if self.entry:
            return ObjectInfo(st.st_size, f"entry-{st.st_ino:x}-{st.st_size:x}")
        return ObjectInfo(st.st_size, f"{st.st_mtime_ns:x}-{st.st_size:x}")

    def open_range(
        self,
        start: int,
        end: int,
        pin: ObjectInfo | None,
        timeout_s: float,
        allow_skip: bool = False,
    ) -> tuple[ObjectInfo, Body]:
        info = self.stat()
        if pin is not None and info != pin:
            raise ObjectChanged(self.uri, "the file changed while loading; load it again")
        if start >= info.size:
            raise FetchError(self.uri, f"offset {start} is past the end ({info.size} bytes)")
        return info, LocalBody(self, start, min(end, info.size))

    def read_all(self) -> bytes:
        return self.path.read_bytes()

    def list_names(self) -> list[str]:
        try:
            return sorted(p.name for p in self.path.parent.iterdir())
        except OSError:
            return []

    def close(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class ObjectStore:
    """Opens objects of every scheme for one caller (a load, a worker's model directory).

    S3 credentials are resolved once, on first use, and shared by every object it opens (the
    credential chain may ask instance metadata or STS: once, not per file); connections are
    shared per endpoint by every store. Safe to use from several threads.

    >>> store = ObjectStore(S3Options())
    >>> store.read_if_exists("s3://models/llama/generation_config.json")  # bytes, or None
    """

    def __init__(self, s3: S3Options | None = None) -> None:
        self.s3 = s3 or S3Options()
        self._lock = threading.Lock()
        self._endpoint: S3Endpoint | None = None

    def open(self, uri: str) -> Source:
        """The source for one object; raises ObjectNotFound/AccessDenied only when it must ask."""
        if uri.startswith("s3://"):
            from loader.s3 import S3Source

            return S3Source(uri, self.s3_endpoint())
        if uri.startswith("hf://"):
            from loader.hf import HfSource

            return HfSource(uri)
        if is_local(uri):
            return LocalSource(uri)
        raise LoaderError(uri, "unsupported URI scheme (use s3://, hf://, file:// or a local path)")

    def s3_endpoint(self) -> S3Endpoint:
        with self._lock:  # NOTE: concurrent first uses wait for one resolution
            if self._endpoint is None:
                from loader.s3 import S3Endpoint

                self._endpoint = S3Endpoint.resolve(self.s3)
            return self._endpoint

    def read_bytes(self, uri: str) -> bytes:
        """Whole content of a small object (config and tokenizer files)."""
        source = self.open(uri)
        try:
            return source.read_all()
        finally:
            if isinstance(source, LocalSource):
                source.close()

    def read_if_exists(self, uri: str) -> bytes | None:
        """`read_bytes`, or None when the object does not exist: one request, not two."""
        try:
            return self.read_bytes(uri)
        except ObjectNotFound:
            return None

    def exists(self, uri: str) -> bool:
        if is_local(uri):
            return local_path(uri).is_file()
        try:
            self.open(uri).stat()
        except ObjectNotFound:
            return False
        return True


def open_source(uri: str, s3: S3Options | None = None) -> Source:
    """The source for one object; raises ObjectNotFound/AccessDenied only when it must ask."""
    return ObjectStore(s3).open(uri)


def read_bytes(uri: str, s3: S3Options | None = None) -> bytes:
    """Whole content of a small object (config and tokenizer files)."""
    return ObjectStore(s3).read_bytes(uri)


def exists(uri: str, s3: S3Options | None = None) -> bool:
    return ObjectStore(s3).exists(uri)

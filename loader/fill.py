"""Filling the cache tiers after a load, off its critical path.

A load writes no cache entry while it runs, so with tiers on and a miss it costs what a load
without tiers costs. It returns a `TierFill` naming, per object it read from the origin or from
a slower tier, the faster tiers to fill; the caller runs it when it likes (typically in a
daemon thread once the model is serving), once or never: `run()` is idempotent.

    >>> result = loader.load(uri, options=options)
    >>> threading.Thread(target=result.fill_tiers, daemon=True).start()

Per object, when the fill runs:

1. targets: the tiers to fill that still lack this version (another process may have filled
   them meanwhile) and can fit it (LRU eviction makes room);
2. bytes: from the fastest tier now holding the version (a local copy; a disk hit refills the
   host tier this way), else from the origin: ranged GETs pinned to the version the load read
   (If-Match ETag, Content-Range, size: the loader's `Fetcher`, with its retries and
   timeouts) on `fill_concurrency` connections, or for hf:// objects hf_transfer when it is
   installed (into the slowest target, then copied to the faster ones);
3. each part lands in one of `fill_concurrency` part buffers (all the extra memory a fill
   uses) and is written to every target's temporary file;
4. check: the copy starts with the header bytes the load parsed (same version, same layout);
5. commit: each entry is renamed into place. On any error its temporary files are removed
   and the error goes to `FillReport.failed`; `run()` never raises it.

The bytes are read again rather than taken from the loaded tensors: on CUDA the staging
ring's slots are recycled as the load goes, and on CPU the tensors are the caller's once the
load returns (cast, fused, or written in place), so they are not a copy anyone can check.
The loaded tensors share no memory with a fill, so a fill that fails cannot affect them.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loader.cache import FanOutWriter, Tier
from loader.errors import CorruptCheckpoint, ObjectChanged, ObjectNotFound
from loader.fetch import Fetcher, Task
from loader.heads import ObjectHead
from loader.hf import HfSource, hf_transfer_installed
from loader.http import ObjectInfo
from loader.options import LoadOptions, MiB
from loader.plan import Part, Segment
from loader.sinks import Chunk
from loader.sources import LocalSource, ObjectStore, Source

FILL_PART_BYTES = 8 * MiB  # largest read of a fill; one buffer of it per connection


@dataclass(frozen=True, slots=True)
class FillJob:
    """One object that tiers faster than the one the load read it from lack."""

    uri: str  # the object at its origin
    version: ObjectInfo  # the origin version the load read: what entries are keyed on
    raw_header: bytes  # its 8-byte prefix and header as the load parsed them
    stream: bool  # its origin ignores Range: read it as one stream
    tiers: tuple[str, ...]  # the tiers to fill, fastest first


@dataclass(frozen=True, slots=True)
class FillReport:
    """What a fill did."""

    filled: tuple[tuple[str, str], ...]  # (tier, uri) of every entry written
    failed: dict[str, str] = field(default_factory=dict)  # uri → why it was not cached
    seconds: float = 0.0  # wall time of the fill


def fill_jobs(heads: Sequence[ObjectHead], tiers: Sequence[Tier]) -> tuple[FillJob, ...]:
    """What a load leaves to fill: for each object read from its origin, every tier; for one
    read from a tier, the faster ones. Local files to begin with are not copied."""
    names = [t.name for t in tiers]
    jobs = []
    for h in heads:
        if h.tier is None and not h.source.remote:
            continue
        faster = names if h.tier is None else names[: names.index(h.tier)]
        if faster:
            jobs.append(FillJob(h.source.uri, h.version, h.raw, h.stream, tuple(faster)))
    return tuple(jobs)


class TierFill:
    """Fills the cache tiers a load left to fill; `run()` does it once, later calls (from any
    thread) wait for it and return the same report; `cancel()` stops it early."""

    def __init__(
        self,
        jobs: Sequence[FillJob],
        tiers: Sequence[Tier],
        options: LoadOptions,
        store: ObjectStore | None = None,
    ) -> None:
        self.jobs = tuple(jobs)  # what is left to fill
        self._tiers = tuple(tiers)  # fastest first
        self._options = options
        self._store = store or ObjectStore(options.s3)  # opens the origins (the load's)
        self._lock = threading.Lock()
        self._report: FillReport | None = None
        self._cancelled = threading.Event()
        self._fetcher: Fetcher | None = None  # the one running now
        self._temp: list[Path] = []  # temporary files being written now

    def run(self) -> FillReport:
        with self._lock:
            if self._report is None:
                # NOTE: a daemon thread is stopped mid-write when the process exits: remove
                # the temporary files first (a killed process's are swept by later writers)
                atexit.register(self.cancel)
                try:
                    self._report = self._run()
                finally:
                    atexit.unregister(self.cancel)
            return self._report

    def cancel(self) -> None:
        """Stop a running fill (any thread): its temporary files are removed at once."""
        self._cancelled.set()
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.cancelled.set()
        for path in list(self._temp):
            path.unlink(missing_ok=True)

    def _run(self) -> FillReport:
        t0 = time.monotonic()
        filled: list[tuple[str, str]] = []
        failed: dict[str, str] = {}
        for job in self.jobs:
            try:
                if self._cancelled.is_set():
                    raise InterruptedError("fill cancelled")
                filled += [(tier, job.uri) for tier in self._fill(job)]
            # NOTE: a fill runs beside a serving model: whatever goes wrong (storage, disk,
            # a bug) costs the cache entry only, never the caller's thread
            except Exception as exc:
                failed[job.uri] = f"{type(exc).__name__}: {exc}"
        return FillReport(tuple(filled), failed, time.monotonic() - t0)

    def _fill(self, job: FillJob) -> list[str]:
        """Fill the tiers that lack `job`'s object; the names of those filled."""
        wanted = [t for t in self._tiers if t.name in job.tiers]
        targets = [t for t in wanted if t.cache.lookup(job.uri, job.version) is None]
        if not targets:
            return []
        source, pin = self._open_source(job, targets)
        try:
            if isinstance(source, HfSource) and self._use_hf_transfer():
                slowest = targets[-1]
                download = self._hf_download(source, job)
                if slowest.cache.fill(job.uri, job.version, download) is not None:
                    return [slowest.name, *self._fill(job)]  # the rest copy the new entry
            return self._copy(job, source, pin, targets)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _open_source(self, job: FillJob, targets: Sequence[Tier]) -> tuple[Source, ObjectInfo]:
        """The fastest tier holding the version (not a target), else the origin; its pin."""
        for tier in self._tiers:
            if tier in targets:
                continue
            hit = tier.cache.lookup(job.uri, job.version)
            if hit is None:
                continue
            try:
                entry = LocalSource(job.uri, hit, entry=True)
            except ObjectNotFound:
                continue  # evicted since the lookup
            return entry, entry.stat()
        origin = self._store.open(job.uri)
        if origin.stat() != job.version:
            raise ObjectChanged(job.uri, "the object changed since it was loaded; not cached")
        return origin, job.version

    def _copy(
        self, job: FillJob, source: Source, pin: ObjectInfo, targets: Sequence[Tier]
    ) -> list[str]:
        made = [(t.name, t.cache.writer(job.uri, job.version)) for t in targets]
        names = [name for name, w in made if w is not None]
        writers = [w for _, w in made if w is not None]
        if not writers:
            return []  # too large for every target
        out = FanOutWriter(writers)
        self._temp = [w.tmp for w in writers]
        try:
            self._receive(job, source, pin, out)
            for got in out.read(0, len(job.raw_header)):
                if got != job.raw_header:
                    raise CorruptCheckpoint(
                        job.uri, "the copy's header differs from the one the load read"
                    )
            out.commit()
        except BaseException:
            out.abort()
            raise
        finally:
            self._temp = []
        return names

    def _receive(self, job: FillJob, source: Source, pin: ObjectInfo, out: FanOutWriter) -> None:
        """Every byte of the object into `out`, through `fill_concurrency` part buffers."""
        size = job.version.size
        part_bytes = min(self._options.part_bytes or FILL_PART_BYTES, FILL_PART_BYTES)
        # the whole object, in order; a part's one segment is all of it
        spans = [(a, min(a + part_bytes, size)) for a in range(0, size, part_bytes)]
        parts = tuple(
            Part(i, 0, a, b, (Segment(a, b - a, a),), False) for i, (a, b) in enumerate(spans)
        )
        if job.stream and source.remote:
            tasks = [Task(parts, True)]
        else:
            tasks = [Task((p,), False) for p in parts]
        threads = max(1, min(self._options.fill_concurrency, len(tasks)))
        fetcher = Fetcher([source], [pin], {}, self._options)
        self._fetcher = fetcher
        try:
            if self._cancelled.is_set():
                raise InterruptedError("fill cancelled")
            sink = _FillSink(out, threads, part_bytes, fetcher.landed)
            fetcher.run(tasks, sink, len(parts), lambda part: None, threads)
        finally:
            self._fetcher = None

    def _use_hf_transfer(self) -> bool:
        return self._options.hf_transfer and hf_transfer_installed()

    def _hf_download(self, source: HfSource, job: FillJob) -> Callable[[Path], None]:
        def download(tmp: Path) -> None:
            self._temp = [tmp]
            try:
                source.download(
                    tmp, self._options.fill_concurrency, FILL_PART_BYTES, self._options.max_retries
                )
                with tmp.open("rb") as f:
                    if f.read(len(job.raw_header)) != job.raw_header:
                        raise CorruptCheckpoint(
                            job.uri, "the download's header differs from the one the load read"
                        )
            finally:
                self._temp = []

        return download


class _FillSink:
    """Parts land in a pool of buffers (one per fetching thread), then go to the new entries."""

    def __init__(
        self, out: FanOutWriter, num_buffers: int, part_bytes: int, landed: Callable[[Part], None]
    ) -> None:
        self._out = out
        self._landed = landed
        self._free: queue.Queue[memoryview] = queue.Queue()
        for _ in range(num_buffers):
            self._free.put(memoryview(bytearray(part_bytes)))

    def acquire(self, part: Part, cancelled: threading.Event) -> tuple[list[Chunk], object]:
        buf = self._free.get()  # never waits: each fetching thread returns its buffer
        return [buf[: part.size_bytes]], buf

    def received(self, part: Part, handle: object) -> None:
        assert isinstance(handle, memoryview)
        try:
            self._out.write(part.start, handle[: part.size_bytes])
        finally:
            self._free.put(handle)
        self._landed(part)

    def abandon(self, handle: object) -> None:
        assert isinstance(handle, memoryview)
        self._free.put(handle)

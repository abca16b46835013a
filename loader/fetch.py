"""Run a plan: a bounded number of threads issue ranged reads and receive each part straight
into the chunks the sink hands out, with per-part retries, backoff and relative timeouts.

Threads only do I/O (the socket reads release the GIL); bookkeeping happens in the caller's
thread, which gets every landed part through `on_landed`. The first error that is not
transient (not found, access denied, object changed) or a part that exhausts its retries
cancels the load and is raised in the caller's thread.
"""

from __future__ import annotations

import queue
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loader.errors import FetchError
from loader.http import ObjectInfo, Retryable
from loader.options import LoadOptions
from loader.plan import Part
from loader.sinks import Chunk, PartSink
from loader.sources import Body, Source

# Receive at most this much per call, so deadlines and cancellation are checked between calls.
RECV_CHUNK_BYTES = 8 << 20
_SCRATCH_BYTES = 1 << 20


class MemoryBody:
    """Bytes already received (the data that came with the header), served like a response."""

    def __init__(self, data: memoryview, pos: int) -> None:
        self._data = data
        self._base = pos
        self.pos = pos
        self.end = pos + len(data)

    def readinto(self, out: memoryview) -> int:
        off = self.pos - self._base
        out[:] = self._data[off : off + len(out)]
        self.pos += len(out)
        return len(out)

    def skip_to(self, offset: int, scratch: memoryview) -> None:
        self.pos = max(self.pos, offset)

    def close(self) -> None:
        pass


class TimeoutPolicy:
    """Per-request timeout: fixed until 3 parts are timed, then relative to their median."""

    def __init__(self, options: LoadOptions) -> None:
        self._o = options
        self._s_per_byte: list[float] = []
        self._lock = threading.Lock()

    def observe(self, nbytes: int, seconds: float) -> None:
        if nbytes >= 64 << 10:
            with self._lock:
                self._s_per_byte.append(seconds / nbytes)
                if len(self._s_per_byte) > 256:
                    del self._s_per_byte[:128]

    def timeout_for(self, nbytes: int, attempt: int) -> float:
        with self._lock:
            samples = list(self._s_per_byte)
        if len(samples) < 3:
            base = self._o.timeout_s
        else:
            relative = self._o.slowdown_factor * float(statistics.median(samples)) * nbytes
            base = min(self._o.timeout_s, max(self._o.min_part_timeout_s, relative))
        return float(base * 2.0**attempt)  # a part that timed out gets more time per retry


@dataclass(frozen=True, slots=True)
class Task:
    parts: tuple[Part, ...]  # consecutive parts of one object
    stream: bool  # one response for all of them (a server that ignores Range)


@dataclass
class FetchStats:
    retries: int = 0  # part retries
    parts: int = 0  # parts landed
    errors: list[str] = field(default_factory=list)  # last transient errors, for messages


class Fetcher:
    def __init__(
        self,
        sources: list[Source],
        pins: list[ObjectInfo],
        prefetched: dict[int, tuple[int, memoryview]],
        options: LoadOptions,
    ) -> None:
        self.sources = sources
        self.pins = pins
        self.prefetched = prefetched  # shard → (data_offset, bytes [data_offset, prefetched_end))
        self.options = options
        self.timeouts = TimeoutPolicy(options)
        self.stats = FetchStats()
        self.cancelled = threading.Event()
        self._done: queue.Queue[Part | BaseException] = queue.Queue()
        self._lock = threading.Lock()

    def landed(self, part: Part) -> None:
        """Sink callback (any thread): the part's bytes are in the arena."""
        self._done.put(part)

    def run(
        self,
        tasks: list[Task],
        sink: PartSink,
        num_parts: int,
        on_landed: Callable[[Part], None],
        threads: int,
    ) -> None:
        """Fetch everything into `sink`; returns when every part landed (the sink calls
        `landed`), raises the first hard error."""
        work: queue.Queue[Task] = queue.Queue()
        for t in tasks:
            work.put(t)
        workers = [
            threading.Thread(
                target=self._worker, args=(work, sink), name=f"loader-{i}", daemon=True
            )
            for i in range(max(1, min(threads, len(tasks))))
        ]
        for w in workers:
            w.start()
        landed = 0
        try:
            while landed < num_parts:
                item = self._done.get()
                if isinstance(item, BaseException):
                    raise item
                landed += 1
                on_landed(item)
        finally:
            self.cancelled.set()
            for w in workers:
                w.join(timeout=1.0)
        self.stats.parts = landed

    def _worker(self, work: queue.Queue[Task], sink: PartSink) -> None:
        scratch = memoryview(bytearray(_SCRATCH_BYTES))
        while True:
            if self.cancelled.is_set():
                # NOTE: `run` waits for every part or an error: a cancel from outside
                # (`cancelled.set()` by another thread) must reach it as one
                self._done.put(InterruptedError("load cancelled"))
                return
            try:
                task = work.get_nowait()
            except queue.Empty:
                return
            try:
                self._run_task(task, sink, scratch)
            except BaseException as exc:
                self._done.put(exc)  # before cancelling: the others' InterruptedErrors follow it
                self.cancelled.set()
                return

    def _run_task(self, task: Task, sink: PartSink, scratch: memoryview) -> None:
        shard = task.parts[0].shard
        source = self.sources[shard]
        body: Body | None = None
        try:
            for part in task.parts:
                chunks, handle = sink.acquire(part, self.cancelled)
                try:
                    body = self._receive_part(source, part, chunks, body, task.stream, scratch)
                    if not task.stream and body is not None:
                        body.close()
                        body = None
                except BaseException:
                    sink.abandon(handle)
                    raise
                sink.received(part, handle)
        finally:
            if body is not None:
                body.close()

    def _receive_part(
        self,
        source: Source,
        part: Part,
        chunks: list[Chunk],
        body: Body | None,
        stream: bool,
        scratch: memoryview,
    ) -> Body | None:
        """Fill `chunks` with the part's bytes; retries resume where the last try stopped."""
        got = 0  # bytes of the part received so far
        attempt = 0
        pin = self.pins[part.shard]
        while True:
            t0 = time.monotonic()
            timeout_s = self.timeouts.timeout_for(part.size_bytes - got, attempt)
            try:
                if part.prefetched:
                    base, data = self.prefetched[part.shard]
                    body = MemoryBody(data, base)
                    body.skip_to(part.start + got, scratch)
                elif body is None or body.pos > part.start + got:
                    # stream: one response for the rest of the object (Range is ignored)
                    end = pin.size if stream else part.end
                    _, body = source.open_range(
                        part.start + got, end, pin, timeout_s, allow_skip=stream
                    )
                body.skip_to(part.start + got, scratch)
                got = self._fill(body, part, chunks, got, t0 + timeout_s, scratch)
                self.timeouts.observe(part.size_bytes, time.monotonic() - t0)
                return body
            except (Retryable, TimeoutError) as exc:
                if body is not None:
                    got = max(got, min(body.pos - part.start, part.size_bytes))
                    body.close()
                    body = None
                attempt += 1
                with self._lock:
                    self.stats.retries += 1
                    self.stats.errors = [*self.stats.errors[-4:], str(exc)]
                if attempt > self.options.max_retries:
                    raise FetchError(
                        source.uri,
                        f"bytes {part.start}..{part.end} failed {attempt} times "
                        f"(last: {exc}); the storage is unreachable or overloaded",
                    ) from exc
                if self.cancelled.is_set():
                    raise InterruptedError("load cancelled") from exc
                delay = min(self.options.max_backoff_s, self.options.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random()))

    def _fill(
        self,
        body: Body,
        part: Part,
        chunks: list[Chunk],
        got: int,
        deadline: float,
        scratch: memoryview,
    ) -> int:
        """Receive from `body` (positioned at part.start + got) until the part is complete."""
        pos = 0  # part offset of the current chunk
        for chunk in chunks:
            n = chunk if isinstance(chunk, int) else len(chunk)
            if pos + n <= got:
                pos += n
                continue
            skip = got - pos if got > pos else 0
            while skip < n:
                if self.cancelled.is_set():
                    raise InterruptedError("load cancelled")
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"part {part.start}..{part.end} exceeded its deadline at byte {got}"
                    )
                step = min(n - skip, RECV_CHUNK_BYTES)
                if isinstance(chunk, int):
                    body.readinto(scratch[: min(step, len(scratch))])
                    step = min(step, len(scratch))
                else:
                    body.readinto(chunk[skip : skip + step])
                skip += step
                got = pos + skip
            pos += n
        return got

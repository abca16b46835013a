"""Where received bytes go: straight into the arena (host), or through a pinned ring (device).

HostSink: every part is received by `readinto` directly into its place in the arena; nothing
is staged, nothing copied.

StagedSink: the arena lives on the device. A part is received into a free slot of a bounded
ring of pinned host buffers; the receiving thread then queues async host→device copies of the
part's segments on its own side stream and records an event; a reaper thread waits for events
in order and frees their slots. So downloads and copies overlap part by part, and extra host
memory is the ring, whatever the checkpoint size.

NOTE: a slot is handed out again only after the event recorded behind its copies has
completed (the reaper frees it); the fake copier in the tests delays copies to check this.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from loader.plan import Part

if TYPE_CHECKING:
    import torch

# A chunk to receive: a memoryview to fill, or a count of bytes to read and discard.
Chunk = memoryview | int


class PartSink(Protocol):
    """Where the fetcher receives parts (the arena's sinks below, or a cache fill's files)."""

    def acquire(self, part: Part, cancelled: threading.Event) -> tuple[list[Chunk], object]:
        """Chunks covering the part's bytes in order, and a handle; may block for a slot."""
        ...

    def received(self, part: Part, handle: object) -> None:
        """Called by the receiving thread when every chunk is filled."""
        ...

    def abandon(self, handle: object) -> None: ...


class Sink(PartSink, Protocol):
    arena: torch.Tensor  # the destination: one uint8 tensor on the target device
    copy_wait_s: float  # seconds spent waiting for device copies (0 when nothing is staged)

    def close(self) -> None:
        """Wait for outstanding copies; stop helper threads."""
        ...


def arena_view(arena: torch.Tensor) -> memoryview:
    return arena.numpy().data.cast("B")


def part_chunks(part: Part, dest: memoryview, dest_base: int = 0) -> list[Chunk]:
    """Chunks of `part` whose segments land in `dest` at `arena_offset - dest_base`."""
    out: list[Chunk] = []
    pos = part.start
    for seg in part.segments:
        if seg.obj_start > pos:
            out.append(seg.obj_start - pos)
        off = seg.arena_offset - dest_base
        out.append(dest[off : off + seg.length])
        pos = seg.obj_start + seg.length
    if part.end > pos:
        out.append(part.end - pos)
    return out


class HostSink:
    """Receive into the final host buffer; `landed` is called at once."""

    def __init__(self, arena: torch.Tensor, landed: Callable[[Part], None]) -> None:
        self.arena = arena
        self._view = arena_view(arena)
        self._landed = landed
        self.copy_wait_s = 0.0  # nothing is copied

    def acquire(self, part: Part, cancelled: threading.Event) -> tuple[list[Chunk], object]:
        return part_chunks(part, self._view), None

    def received(self, part: Part, handle: object) -> None:
        self._landed(part)

    def abandon(self, handle: object) -> None:
        pass

    def close(self) -> None:
        pass


class Waitable(Protocol):
    def synchronize(self) -> None: ...


class Copier(Protocol):
    """Async host→device copies; the CUDA one uses a side stream per calling thread."""

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...

    def record(self) -> Waitable:
        """An event completing after every copy this thread queued so far."""
        ...


class CudaCopier:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._local = threading.local()

    def _stream(self) -> torch.cuda.Stream:
        import torch

        s: torch.cuda.Stream | None = getattr(self._local, "stream", None)
        if s is None:
            s = self._local.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        return s

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        import torch

        with torch.cuda.stream(self._stream()):
            dst.copy_(src, non_blocking=True)

    def record(self) -> Waitable:
        import torch

        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self._stream())
        return event


class StagedSink:
    """A bounded ring of pinned slots in front of a device arena."""

    def __init__(
        self,
        arena: torch.Tensor,
        slots: list[torch.Tensor],
        copier: Copier,
        landed: Callable[[Part], None],
    ) -> None:
        self.arena = arena
        self._slots = slots
        self._views = [arena_view(s) for s in slots]
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(len(slots)):
            self._free.put(i)
        self._copier = copier
        self._landed = landed
        self._inflight: queue.Queue[tuple[Waitable, int, Part] | None] = queue.Queue()
        self._reaper = threading.Thread(target=self._reap, name="loader-reaper", daemon=True)
        self._reaper.start()
        self.max_slots_in_use = 0  # observed peak, for tests and metrics
        self._lock = threading.Lock()
        self.copy_wait_s = 0.0  # time the reaper waited on copies

    @property
    def slot_bytes(self) -> int:
        return int(self._slots[0].numel())

    def acquire(self, part: Part, cancelled: threading.Event) -> tuple[list[Chunk], object]:
        assert part.size_bytes <= self.slot_bytes, "parts are planned to fit a slot"
        while True:
            try:
                slot = self._free.get(timeout=0.1)
                break
            except queue.Empty:
                if cancelled.is_set():
                    raise InterruptedError("load cancelled") from None
        with self._lock:
            in_use = len(self._slots) - self._free.qsize()
            self.max_slots_in_use = max(self.max_slots_in_use, in_use)
        # The whole part, gaps included, lands contiguously in the slot.
        return [self._views[slot][: part.size_bytes]], slot

    def received(self, part: Part, handle: object) -> None:
        assert isinstance(handle, int)
        slot = self._slots[handle]
        for seg in part.segments:
            src = seg.obj_start - part.start
            self._copier.copy_async(
                self.arena[seg.arena_offset : seg.arena_offset + seg.length],
                slot[src : src + seg.length],
            )
        self._inflight.put((self._copier.record(), handle, part))

    def abandon(self, handle: object) -> None:
        assert isinstance(handle, int)
        self._free.put(handle)

    def _reap(self) -> None:
        import time

        while True:
            item = self._inflight.get()
            if item is None:
                return
            event, slot, part = item
            t0 = time.perf_counter()
            event.synchronize()
            self.copy_wait_s += time.perf_counter() - t0
            self._free.put(slot)
            self._landed(part)

    def close(self) -> None:
        self._inflight.put(None)
        self._reaper.join()

"""The arena on the target device (torch, CUDA): its allocation, the sink that fills it, and
the result tensors, which are views of it (or of a mapped host-tier entry, `map_entry`).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING

from loader.header import DTYPES
from loader.phases import Ring
from loader.plan import Part, Placement
from loader.sinks import Copier, CudaCopier, HostSink, Sink, StagedSink

if TYPE_CHECKING:
    import torch


def allocate_arena(num_bytes: int, device: torch.device) -> torch.Tensor:
    """One uninitialised uint8 allocation; every byte is written by the fetch before use."""
    import torch

    return torch.empty(num_bytes, dtype=torch.uint8, device=device)


def map_entry(fd: int, size: int) -> torch.Tensor:
    """A uint8 CPU tensor over a private mapping of a cache entry (`fd`, `size` bytes).

    Host-tier entries live on a tmpfs, so the mapping is the entry's own memory: no copy, no
    second allocation. NOTE: the mapping is copy-on-write (MAP_PRIVATE): a write to a tensor
    copies that page for this process and never reaches the entry; and it stays valid after
    the entry is evicted (an unlinked file lives as long as a mapping of it). Entries are
    never modified in place, so the mapping always reads the version that was looked up.
    """
    import torch

    # PROT_WRITE: writes to the tensors are allowed (and private); MAP_POPULATE is not used
    # because on a writable private mapping it would copy every page.
    # NOTE: no MADV_POPULATE_READ either: the pages are faulted in by the first forward pass
    # (read faults map 16 pages at a time), which cost a cold start ~0.08 s less in total than
    # prefaulting 1.16 GB up front (0.08-0.2 s) before that pass (bench/cold_start.py (c)).
    mapping = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mapping, dtype=torch.uint8)  # keeps `mapping` alive


def open_sink(
    arena: torch.Tensor,
    ring: Ring | None,
    device: torch.device,
    copier: Copier | None,
    landed: Callable[[Part], None],
) -> Sink:
    """Receive straight into a host arena, or through `ring` (pinned slots when `device` is
    CUDA) with async copies by `copier` (default: CUDA side streams). Close it when done."""
    import torch

    if ring is None:
        return HostSink(arena, landed)
    pin = device.type == "cuda"
    slots = [
        torch.empty(ring.slot_bytes, dtype=torch.uint8, pin_memory=pin)
        for _ in range(ring.num_slots)
    ]
    return StagedSink(arena, slots, copier or CudaCopier(device), landed)


def tensor_view(arena: torch.Tensor, p: Placement, dtype: torch.dtype | None) -> torch.Tensor:
    """The placement's tensor: a view of the arena, or converted to `dtype` (floating only)."""
    import torch

    tdtype = getattr(torch, DTYPES[p.dtype][0])
    # Views of uint8 storage need offsets that suit the dtype; the plan guarantees it.
    t = arena[p.arena_offset : p.arena_offset + p.size_bytes].view(tdtype).view(p.shape)
    if dtype is not None and t.is_floating_point() and t.dtype != dtype:
        t = t.to(dtype)  # on the arena's device
    return t

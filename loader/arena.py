"""The arena on the target device (torch, CUDA): its allocation, the sink that fills it, and
the result tensors, which are views of it.
"""

from __future__ import annotations

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

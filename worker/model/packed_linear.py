"""The model's linear layers in oneDNN's blocked weight layout, for CPU inference.

A step's GEMMs on CPU are skinny (a decode step multiplies a few dozen rows by each weight):
there torch's default ``F.linear`` (MKL ``sgemm`` on the row-major weight) runs at 1.3-1.9x
the time of oneDNN on a weight reordered once into its blocked layout (measured on this
model's shapes, 1-32 rows, 1-2 threads); from a few hundred rows on they are equal. vLLM's
CPU path does the same (``onednn_mm`` on a prepacked weight). The reorder is done in place,
once, by the model runner after its first step (about 0.1 s per 50M parameters, kept off a
cold start's first token): each ``nn.Linear`` becomes a ``PackedLinear`` holding only the
packed weight, so no memory is spent twice. The packed weight is an opaque oneDNN tensor: it
is not in ``state_dict()`` and cannot be trained; a head tied to the embeddings gets its own
packed copy (the embedding lookup still needs the plain one).

On CUDA, where oneDNN is not built in, or for bf16 weights on a CPU without oneDNN's bf16
path, nothing changes (``F.linear``).

Example:

    >>> packed = pack_linears(model)  # number of layers reordered (0 if not on CPU)
    >>> hidden = model(input_ids, positions, kv_caches, meta)  # same maths, faster GEMMs
"""

from __future__ import annotations

import torch
from torch import nn

# oneDNN's reorder picks its blocked format for this many rows; any row count works after
# (a decode step's batch is of this order; prefill chunks are compute-bound either way)
_ROWS_HINT = 32
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward on a oneDNN-packed weight (CPU). weight: [out_features,
    in_features] (``can_pack``); bias: [out_features] or None."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # NOTE: a plain attribute, not a parameter or buffer: the opaque tensor has no storage
        # that state_dict(), .to() or copies could use
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed_weight, self.bias, "none", [], ""
        )
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def can_pack(weight: torch.Tensor) -> bool:
    """True if ``weight`` would be reordered: on CPU, fp32 or bf16, with oneDNN built in, and
    for bf16 a CPU whose oneDNN bf16 path runs (``onednn_bf16``)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in _PACKABLE_DTYPES
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and (weight.dtype != torch.bfloat16 or onednn_bf16())
    )


def onednn_bf16() -> bool:
    """True where oneDNN runs bf16 GEMMs on this CPU. Its bf16 reorder needs AVX-512 (BW, VL,
    DQ) or AVX-NE-CONVERT and raises elsewhere, so a bf16 model on such a CPU keeps
    ``F.linear``."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported is not None and supported())


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` whose weight ``can_pack`` by a ``PackedLinear``
    (in place; idempotent). Returns how many were replaced."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and can_pack(child.weight)
    ]
    with torch.no_grad():
        for parent, name, child in targets:
            setattr(parent, name, PackedLinear(child.weight, child.bias))
    return len(targets)

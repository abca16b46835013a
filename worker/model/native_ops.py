"""RMSNorm, rotary embeddings, SwiGLU and greedy sampling's argmax on CPU in C
(``csrc/elementwise.c``; built and loaded by ``worker.model.native_build``), for the ``cpu``
attention backend.

Why: torch runs RMSNorm as six ops and the rotary embedding as five, each a pass over memory
with its own temporary; on a prompt chunk of 1024 tokens of a 512-wide model that is ~1.7 ms
and ~1.2 ms per layer against ~0.2 ms each here, and at decode sizes the per-op overhead
dominates. The C code rounds like torch (no fast-math, no contraction): the rotary embedding
is bit for bit the same; RMSNorm differs only in the order of its sum of squares, SwiGLU in
its exponential's last place. The argmax over a step's logits (32 rows of a 32,000-token
vocabulary) takes ~0.3 ms in torch (``max(dim=-1)``) against ~0.08 ms here, and SwiGLU as
``silu(gate).mul_(up)`` over the strided halves of the fused projection ~0.12 ms per layer of a
32-sequence decode step (two passes): per-step costs of every decode.

``attach(model)`` hands the kernels to the model's ``RMSNorm``, ``Attention`` and ``MLP``
modules (the model runner does it when it runs the ``cpu`` backend); they fall back to torch
for anything the kernels do not take (other dtypes, non-contiguous rows).

Example:

    >>> ops = load()  # None without a C compiler
    >>> attach(model, ops)
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch
from torch import nn

from worker.model.native_build import EXACT_FLAGS, NativeLibrary

LIBRARY = NativeLibrary("elementwise", EXACT_FLAGS)

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class RowOps:
    """The loaded kernels."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._rms_norm = library.rms_norm_f32
        self._rms_norm.restype = None
        self._rms_norm.argtypes = [_P, _I64, _P, _P, _I64, _I64, ctypes.c_float, ctypes.c_int]
        self._rope = library.rope_f32
        self._rope.restype = None
        self._rope.argtypes = [_P, _I64, _P, _P, _I64, _I64, _I64, ctypes.c_int]
        self._add_rms_norm = library.add_rms_norm_f32
        self._add_rms_norm.restype = None
        self._add_rms_norm.argtypes = [_P, _P, _P, _P, _I64, _I64, ctypes.c_float, ctypes.c_int]
        self._silu_mul = library.silu_mul_f32
        self._silu_mul.restype = None
        self._silu_mul.argtypes = [_P, _P, _I64, _P, _I64, _I64, ctypes.c_int]
        self._argmax = library.argmax_rows_f32
        self._argmax.restype = None
        self._argmax.argtypes = [_P, _I64, _I64, _I64, _P, ctypes.c_int]

    @staticmethod
    def takes(x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``weight * (x * rsqrt(mean(x^2) + eps))`` over the last dim. x: [..., hidden]
        float32 contiguous (``takes``); weight: [hidden]. Returns a new tensor like x."""
        hidden = x.shape[-1]
        assert self.takes(x) and self.takes(weight) and weight.shape == (hidden,)
        out = torch.empty_like(x)
        rows = x.numel() // hidden
        self._rms_norm(
            x.data_ptr(),
            hidden,
            weight.data_ptr(),
            out.data_ptr(),
            rows,
            hidden,
            eps,
            torch.get_num_threads(),
        )
        return out

    def add_rms_norm_(
        self, branch: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """``residual += branch`` in place (as ``branch + residual``, bit for bit), then
        ``rms_norm(residual)``, in one pass. branch, residual: [..., hidden] float32
        contiguous, the same shape. Returns the norm, a new tensor."""
        hidden = residual.shape[-1]
        assert self.takes(branch) and self.takes(residual) and branch.shape == residual.shape
        assert self.takes(weight) and weight.shape == (hidden,)
        out = torch.empty_like(residual)
        self._add_rms_norm(
            branch.data_ptr(),
            residual.data_ptr(),
            weight.data_ptr(),
            out.data_ptr(),
            residual.numel() // hidden,
            hidden,
            eps,
            torch.get_num_threads(),
        )
        return out

    def rope_(self, x: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """In place on the first ``num_heads`` heads of each token: ``x * cos +
        rotate_half(x) * sin``. x: [tokens, width >= num_heads * D] float32 contiguous;
        cos, sin: [tokens, D] float32 contiguous."""
        tokens, head_dim = cos.shape
        assert self.takes(x) and self.takes(cos) and self.takes(sin) and sin.shape == cos.shape
        assert x.dim() == 2 and x.shape[0] == tokens and x.shape[1] >= num_heads * head_dim
        assert head_dim % 2 == 0
        self._rope(
            x.data_ptr(),
            x.shape[1],
            cos.data_ptr(),
            sin.data_ptr(),
            tokens,
            num_heads,
            head_dim,
            torch.get_num_threads(),
        )

    def silu_mul(self, gate_up: torch.Tensor, width: int) -> torch.Tensor:
        """SwiGLU's ``silu(gate) * up`` in one pass, ``gate, up = gate_up.split(width, -1)``
        (within a few units in the last place of torch's). gate_up: [rows, 2 * width] float32
        contiguous. Returns [rows, width]."""
        rows = gate_up.shape[0]
        assert self.takes(gate_up) and gate_up.dim() == 2 and gate_up.shape[1] == 2 * width
        out = torch.empty(rows, width, dtype=gate_up.dtype)
        pointer = gate_up.data_ptr()
        self._silu_mul(
            pointer,
            pointer + width * gate_up.element_size(),
            2 * width,
            out.data_ptr(),
            rows,
            width,
            torch.get_num_threads(),
        )
        return out

    def argmax(self, x: torch.Tensor) -> list[int]:
        """Each row's first maximum, NaN counting as the greatest: ``x.max(dim=-1).indices``
        (the greedy token of each row of logits). x: [rows, cols] float32, rows contiguous."""
        rows, cols = x.shape
        assert x.device.type == "cpu" and x.dtype == torch.float32 and x.stride(1) == 1
        assert 0 < cols < 2**31
        out = torch.empty(rows, dtype=torch.int64)
        self._argmax(x.data_ptr(), x.stride(0), rows, cols, out.data_ptr(), torch.get_num_threads())
        indices: list[int] = out.tolist()
        return indices


class _UsesRowOps(Protocol):
    native: RowOps | None


def load() -> RowOps | None:
    """The kernels, built if needed; None (logged once) where they cannot be built."""
    return LIBRARY.bind(RowOps)


def attach(model: nn.Module, ops: RowOps | None) -> int:
    """Hand ``ops`` to every module of ``model`` that has a ``native`` slot (None takes them
    back). Returns how many modules got them."""
    count = 0
    for module in model.modules():
        if hasattr(module, "native"):
            target: _UsesRowOps = module  # type: ignore[assignment]
            target.native = ops
            count += 1
    return count

"""Greedy tokens without the float32 LM head: a bfloat16 screen, then float32 for the few tokens
it cannot rule out, with the float32 head's answer proven (``csrc/greedy_head.c``).

Why: the LM head is the largest GEMM of a decode step (32 rows by a 32,000 x 512 float32
weight: ~6 ms of ~22 at 2 threads, ~13 of ~45 at 1). Where the CPU multiplies bfloat16 in
hardware (AVX512-BF16 / AMX), the same product in bfloat16 takes ~1 ms, and a greedy row only
needs the maximum.

The bound. Let h be a row's float32 hidden state and w_j token j's weights (K values each),
e_j = h . w_j the exact logit and S_j = sum_k |h_k w_jk| <= |h| |w_j| (Cauchy-Schwarz). With
u = 2^-8 (bfloat16's unit roundoff) and g = K 2^-24 / (1 - K 2^-24) (a float32 sum of K terms,
in any order):
- rounding h and w_j to bfloat16 moves each product by at most (2u + u^2) |h_k w_jk|;
- the bfloat16 GEMM's float32 accumulation adds at most g (1 + u)^2 S_j, and rounding its
  output a_j to bfloat16 at most u / (1 - u) |a_j|;
- any float32 evaluation f_j of the logit (the float32 head's, or this module's) is within
  g S_j of e_j.
So |a_j - f_j| <= (2u + u^2 + g (1 + u)^2 + g) |h| max_j |w_j| + u / (1 - u) max_j |a_j| =: E,
and no token with a_j < max(a) - 2E can be the float32 maximum. Candidates above that are
computed in float32 (dot product and mass S_j); the winner is accepted only if it beats every
other candidate by more than both evaluations' rounding, 2g (S_best + S_j): then the float32
head, summing in whatever order, picks it too, as its first maximum. A row that fails (a tie,
a near tie, a non-finite value, too many candidates) returns None and the caller computes its
full logits. The screen's constants are doubled for safety (the norms' own rounding, the
bfloat16 units' denormal handling); that costs a few more candidates, never a wrong token.

On random weights a row has a handful of candidates, and about one row in two hundred is a near
tie that falls back. Memory: the head's float32 weight stays in its plain layout (beside the
packed copy the full head uses) and gains a bfloat16 copy: 6 bytes per weight.

Example:

    >>> head = GreedyHead.build(model.lm_head.weight)  # None where it would not be faster
    >>> tokens = head.argmax(hidden)  # [rows] greedy token ids, None where undecided
"""

from __future__ import annotations

import ctypes

import torch

from worker.model.native_build import EXACT_FLAGS, NativeLibrary
from worker.model.packed_linear import PackedLinear

LIBRARY = NativeLibrary("greedy_head", EXACT_FLAGS)

# bfloat16's unit roundoff (8 significant bits, round to nearest)
_U = 2.0**-8
# candidates a row may have before it falls back (each costs one K-long dot product)
MAX_CANDIDATES = 1024

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_F = ctypes.c_float


def bounds(k: int) -> tuple[float, float, float]:
    """(screen, relative, margin) for rows of ``k`` values (module doc). The screen's terms are
    doubled (a few more candidates); the margin is the bound itself, with g taken for k + 1
    terms (this module rounds each product before adding it) and the masses' own rounding."""
    unit = (k + 1) * 2.0**-24
    if unit >= 0.5:
        raise ValueError(f"hidden size {k} too large for a float32 rounding bound")
    g = unit / (1 - unit)
    screen = 2 * (2 * _U + _U * _U + g * (1 + _U) ** 2 + g)
    relative = 2 * _U / (1 - _U)
    margin = 2 * g * (1 + 4 * g)
    return screen, relative, margin


def hardware_bf16() -> bool:
    """True where the CPU multiplies bfloat16 in hardware (elsewhere the screen is no faster)."""
    return bool(
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    )


class _Kernel:
    """``greedy_screen`` of the loaded library, its argument types set once."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.screen_rows = library.greedy_screen
        self.screen_rows.restype = None
        self.screen_rows.argtypes = [_P, _I64, _P, _P, _I64, _I64, _I64]
        self.screen_rows.argtypes += [_F, _F, _F, _F, _I64, _P, ctypes.c_int]


class GreedyHead:
    """The screen over one LM head weight ([vocab, hidden] float32 on CPU)."""

    def __init__(self, kernel: _Kernel, weight: torch.Tensor) -> None:
        assert weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
        self.weight = weight.detach().contiguous()
        self.vocab, self.k = self.weight.shape
        self.screen, self.relative, self.margin = bounds(self.k)
        self.approx_head = PackedLinear(self.weight.to(torch.bfloat16))
        # the largest row norm, in float64 (a few thousand rows at a time), rounded up a little
        w_norm_max = max(
            float(torch.linalg.vector_norm(rows.double(), dim=1).max())
            for rows in torch.split(self.weight, 4096)
        )
        self.w_norm_max = w_norm_max * (1 + 2.0**-20)
        self._screen_rows = kernel.screen_rows

    @classmethod
    def build(cls, weight: torch.Tensor) -> GreedyHead | None:
        """The screen for ``weight``, or None where it would not help (not a float32 CPU
        weight, no bfloat16 units, no C compiler)."""
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
            return None
        if not hardware_bf16():
            return None
        kernel = LIBRARY.bind(_Kernel)
        return None if kernel is None else cls(kernel, weight)

    def argmax(self, hidden: torch.Tensor) -> list[int | None]:
        """Each row's greedy token (the first maximum of ``hidden @ weight.T`` in float32), or
        None where the screen cannot prove it. hidden: [rows, hidden] float32."""
        rows = hidden.shape[0]
        assert hidden.dim() == 2 and hidden.shape[1] == self.k and hidden.dtype == torch.float32
        hidden = hidden.contiguous()
        # approx: [rows, vocab] bfloat16
        approx = self.approx_head(hidden.to(torch.bfloat16))
        assert approx.dtype == torch.bfloat16 and approx.stride(1) == 1
        out = torch.empty(rows, dtype=torch.int64)
        self._screen_rows(
            approx.data_ptr(),
            approx.stride(0),
            hidden.data_ptr(),
            self.weight.data_ptr(),
            rows,
            self.vocab,
            self.k,
            self.w_norm_max,
            self.screen,
            self.relative,
            self.margin,
            MAX_CANDIDATES,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        return [t if t >= 0 else None for t in out.tolist()]

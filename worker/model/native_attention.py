"""The CPU attention kernels: decodes (``csrc/paged_decode.c``) and prompts
(``csrc/paged_prefill.c``), built and loaded by ``worker.model.native_build``.

Why C: a decode step's attention on CPU in torch gathers every sequence's blocks into a scratch
buffer and runs SDPA over it, so each cached key and value crosses memory three times (read,
write, read again), padding included; the decode kernel reads them once, in place, from the
paged cache (vLLM's CPU backend does the same with its C++ kernels). For prompts, torch runs
one SDPA call per sequence (a gather first where part of it was cached), at about half the
machine's multiply-add rate on prompt-sized chunks; the prefill kernel runs every prompt of a
step in one call, flash-attention style over the paged cache, at 1.5-2.3x that speed (measured
on 8 query and 2 kv heads of 64, 100-1,000 tokens, 1-2 threads).

Example:

    >>> kernel = load()  # None without a C compiler
    >>> kernel.decode(q, k_cache, v_cache, block_tables, seq_lens, scale, window, out)
    >>> prefill = load_prefill()
    >>> prefill.prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
    ...                 window, out)
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from worker.model.native_build import FAST_MATH_FLAGS, NativeLibrary

LIBRARY = NativeLibrary("paged_decode", FAST_MATH_FLAGS)
PREFILL_LIBRARY = NativeLibrary("paged_prefill", FAST_MATH_FLAGS)
# the prefill kernel's widest head (its tile buffers are sized for it)
PREFILL_MAX_HEAD_DIM = 256

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


# both attention kernels' leading arguments (``_arguments``)
_ARGUMENT_TYPES: list[type[ctypes._SimpleCData[Any]]] = [
    *(_P, _I64, _P, _P, _P, _I64, _P, _P),
    *(_I64, _I64, _I64, _I64, _I64),
    ctypes.c_float,
    _I64,
    ctypes.c_int,
]


def _arguments(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None,
    out: torch.Tensor,
) -> tuple[int | float, ...]:
    """The attention kernels' leading arguments (the caller has checked the layouts)."""
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    return (
        *(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr()),
        *(block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(), out.data_ptr()),
        *(seq_lens.shape[0], num_heads, num_kv_heads, head_dim, block_size),
        scale,
        window or 0,
        torch.get_num_threads(),
    )


class DecodeKernel:
    """The loaded kernel."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.paged_decode_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = _ARGUMENT_TYPES

        self._store = library.store_kv_f32
        self._store.restype = None
        self._store.argtypes = [_P, _I64, _P, _I64, _P, _P, _P, _I64, _I64, ctypes.c_int]

    @staticmethod
    def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        return (
            q.device.type == "cpu"
            and q.dtype == torch.float32
            and k_cache.dtype == torch.float32
            and q.stride(2) == 1
            and q.stride(1) == q.shape[2]
            and k_cache.is_contiguous()
        )

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        out: torch.Tensor,
    ) -> None:
        """One new token per sequence: ``out[i] = attention(q[i], its cached keys/values)``.

        q: [n, Hq, D] float32, heads contiguous (rows may be apart: a view of a fused
        projection); out: [n, Hq, D] contiguous; caches: [num_blocks, block_size, Hkv, D];
        block_tables: [n, max_blocks] int32 (rows contiguous); seq_lens: [n] int32 (>= 1).
        """
        n, num_heads, num_kv_heads = q.shape[0], q.shape[1], k_cache.shape[2]
        # NOTE: the C code trusts these; a wrong stride or dtype would read out of bounds
        assert out.shape == q.shape and out.is_contiguous() and v_cache.shape == k_cache.shape
        assert v_cache.is_contiguous() and block_tables.dtype == seq_lens.dtype == torch.int32
        assert block_tables.shape[0] == n == seq_lens.shape[0] and block_tables.stride(1) == 1
        assert seq_lens.is_contiguous() and num_heads % num_kv_heads == 0
        assert self.supports(q, k_cache)
        status = self._fn(
            *_arguments(q, k_cache, v_cache, block_tables, seq_lens, scale, window, out)
        )
        if status != 0:
            raise MemoryError("paged decode attention: out of memory for its score buffers")

    def store(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """``store_kv_ref`` in one pass: token ``t``'s keys and values to slot
        ``slot_mapping[t]`` of the caches, slots < 0 skipped. k, v: [tokens, Hkv, D] float32,
        heads contiguous (tokens may be apart); slot_mapping: [tokens] int64 below the caches'
        slot count (the runner's invariant)."""
        tokens, num_kv_heads, head_dim = k.shape
        # NOTE: the C code trusts these; a wrong stride or dtype would write out of bounds
        assert v.shape == k.shape and k_cache.shape[2:] == (num_kv_heads, head_dim)
        assert self.supports(k, k_cache) and self.supports(v, v_cache)
        assert v_cache.shape == k_cache.shape and v_cache.is_contiguous()
        assert slot_mapping.dtype == torch.int64 and slot_mapping.shape == (tokens,)
        assert slot_mapping.is_contiguous()
        self._store(
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slot_mapping.data_ptr(),
            tokens,
            num_kv_heads * head_dim,
            torch.get_num_threads(),
        )


class PrefillKernel:
    """The loaded prefill kernel."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.paged_prefill_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [*_ARGUMENT_TYPES, _P]

    @staticmethod
    def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        # the kernel works in whole 16-float vectors of a head
        head_dim = q.shape[2]
        return (
            DecodeKernel.supports(q, k_cache)
            and head_dim % 16 == 0
            and head_dim <= PREFILL_MAX_HEAD_DIM
        )

    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        out: torch.Tensor,
    ) -> None:
        """Sequence ``i``'s new tokens ``q[query_start_loc[i]:query_start_loc[i + 1]]`` attend
        causally to its ``seq_lens[i]`` cached positions (theirs included: written first).

        q: [tokens, Hq, D] float32, heads contiguous (tokens may be apart: a view of a fused
        projection); out: [tokens, Hq, D] contiguous; caches: [num_blocks, block_size, Hkv, D];
        block_tables: [n, max_blocks] int32 (rows contiguous); query_start_loc: [n + 1] int32
        from 0; seq_lens: [n] int32, each at least its sequence's new tokens.
        """
        tokens, num_heads, num_kv_heads = q.shape[0], q.shape[1], k_cache.shape[2]
        n = seq_lens.shape[0]
        # NOTE: the C code trusts these; a wrong stride or dtype would read out of bounds
        assert out.shape == q.shape and out.is_contiguous() and v_cache.shape == k_cache.shape
        assert v_cache.is_contiguous() and block_tables.stride(1) == 1
        assert block_tables.dtype == seq_lens.dtype == query_start_loc.dtype == torch.int32
        assert block_tables.shape[0] == n and query_start_loc.shape == (n + 1,)
        assert query_start_loc.is_contiguous() and seq_lens.is_contiguous()
        assert num_heads % num_kv_heads == 0 and self.supports(q, k_cache)
        assert int(query_start_loc[n]) == tokens
        arguments = _arguments(q, k_cache, v_cache, block_tables, seq_lens, scale, window, out)
        status = self._fn(*arguments, query_start_loc.data_ptr())
        if status != 0:
            raise MemoryError("paged prefill attention: out of memory for its tile buffers")


def load() -> DecodeKernel | None:
    """The decode kernel, built if needed; None (logged once) where it cannot be built."""
    return LIBRARY.bind(DecodeKernel)


def load_prefill() -> PrefillKernel | None:
    """The prefill kernel, built if needed; None (logged once) where it cannot be built."""
    return PREFILL_LIBRARY.bind(PrefillKernel)

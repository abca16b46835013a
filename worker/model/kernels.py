"""Triton kernels for the paged KV cache: write a step's keys/values, attend over the cache.

Same semantics as the torch reference in ``worker.model.attention`` (``store_kv_ref``,
``paged_attention_ref``); ``tests/unit/test_kernels.py`` compares them. Used on CUDA. With
``TRITON_INTERPRET=1`` in the environment when triton is first imported, the kernels run in
Triton's interpreter on CPU tensors: that is how the tests exercise them without a GPU.

``paged_attention`` is one kernel for decodes, whole prompts and prompt chunks after cached
context: program (sequence, query head, tile of BLOCK_M query tokens) walks the sequence's
blocks up to its last query position with an online softmax (FlashAttention-2 style). With a
sliding window it starts at the block holding the tile's first visible key: blocks freed out of
the window (placeholders in the block table) are never loaded at all.

NOTE: fp32 inputs use IEEE dot products (no TF32), so fp32 results match the reference to
rounding. Block sizes must be powers of two >= 16 (``tl.dot`` tile constraints on GPUs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# query tokens per program of the attention kernel
BLOCK_M = 16


@triton.jit  # type: ignore[untyped-decorator]
def _store_kv_kernel(  # type: ignore[no-untyped-def]
    K,
    V,
    K_cache,
    V_cache,
    slot_mapping,
    stride_k_tok,
    stride_v_tok,
    ROW: tl.constexpr,  # num_kv_heads * head_dim
    BLOCK: tl.constexpr,  # next power of two >= ROW
):
    # one program per new token: copy its [num_kv_heads, head_dim] row to its cache slot
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(K + t * stride_k_tok + offs, mask=mask)
        v = tl.load(V + t * stride_v_tok + offs, mask=mask)
        tl.store(K_cache + slot * ROW + offs, k, mask=mask)
        tl.store(V_cache + slot * ROW + offs, v, mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def _paged_attention_kernel(  # type: ignore[no-untyped-def]
    Q,
    K_cache,
    V_cache,
    Out,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    stride_bt_seq,
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next power of two >= HEAD_DIM
    BLOCK_M: tl.constexpr,  # query tokens per program
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    WINDOW: tl.constexpr,  # sliding window (0: none)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no TF32); the default otherwise
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    if tile * BLOCK_M < q_len:
        seq_len = tl.load(seq_lens + seq)
        context = seq_len - q_len  # position of the sequence's first new token
        kv_head = head // GROUP
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_SIZE)
        m_valid = offs_m < q_len
        d_valid = offs_d < HEAD_DIM
        # q: [BLOCK_M, BLOCK_D]
        q_ptrs = Q + (q_start + offs_m)[:, None] * stride_q_tok + head * stride_q_head
        q = tl.load(q_ptrs + offs_d[None, :], mask=m_valid[:, None] & d_valid[None, :], other=0.0)
        q_pos = context + offs_m  # [BLOCK_M]

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running softmax denominator
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # keys this tile may see: [lo, hi)
        hi = tl.minimum(context + (tile + 1) * BLOCK_M, seq_len)
        lo = 0
        if WINDOW > 0:
            lo = tl.maximum(context + tile * BLOCK_M - WINDOW + 1, 0)
        for b in range(lo // BLOCK_SIZE, tl.cdiv(hi, BLOCK_SIZE)):
            block_id = tl.load(block_tables + seq * stride_bt_seq + b).to(tl.int64)
            k_pos = b * BLOCK_SIZE + offs_n  # [BLOCK_SIZE]
            kv_offs = (
                block_id * stride_c_block
                + offs_n[:, None] * stride_c_slot
                + kv_head * stride_c_head
                + offs_d[None, :]
            )
            # k, v: [BLOCK_SIZE, BLOCK_D]
            k = tl.load(K_cache + kv_offs, mask=d_valid[None, :], other=0.0)
            # s: [BLOCK_M, BLOCK_SIZE]
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            valid = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < seq_len)
            if WINDOW > 0:
                valid = valid & (q_pos[:, None] - k_pos[None, :] < WINDOW)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # rows with nothing visible yet keep m = -inf; shift them by 0 (exp(-inf) = 0)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V_cache + kv_offs, mask=d_valid[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        o_ptrs = Out + (q_start + offs_m)[:, None] * stride_o_tok + head * stride_o_head
        o_mask = m_valid[:, None] & d_valid[None, :]
        tl.store(o_ptrs + offs_d[None, :], out.to(Out.dtype.element_ty), mask=o_mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k, v ([num_tokens, num_kv_heads, head_dim]) to their slots; slots < 0 skipped."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    # rows must be contiguous (a token's heads back to back); the token stride may be anything
    if k.stride(2) != 1 or k.stride(1) != head_dim:
        k = k.contiguous()
    if v.stride(2) != 1 or v.stride(1) != head_dim:
        v = v.contiguous()
    row = num_kv_heads * head_dim
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        v.stride(0),
        ROW=row,
        BLOCK=triton.next_power_of_2(row),
    )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Causal attention of the step's queries over the paged cache (keys already written).

    q: [num_tokens, num_heads, head_dim]; caches: [num_blocks, block_size, num_kv_heads,
    head_dim]; query_start_loc: [num_seqs + 1]; seq_lens: [num_seqs]; block_tables:
    [num_seqs, max_blocks]. Returns [num_tokens, num_heads, head_dim].
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(
            f"block_size: the Triton kernel needs a power of two >= 16, got {block_size}"
        )
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    assert q.stride(2) == 1
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, BLOCK_M))
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=BLOCK_M,
        BLOCK_SIZE=block_size,
        WINDOW=sliding_window or 0,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out

"""The CPU prefill-attention kernel (worker/model/csrc/paged_prefill.c) against the torch
reference: several prompts per call, fresh and continued (a cached prefix, a chunk of a long
prompt), MHA/GQA/MQA and query groups wider than the kernel's tile, head sizes 16-128, sliding
windows with blocks freed before every query's window (a NaN null block it must never read),
queries that are views of a fused projection, one and two threads; and what the step uses where
the kernel does not apply.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_native_attention import BLOCK_SIZE, paged_caches

# one and two intra-op threads (the kernels split their work on torch's OpenMP threads)
from tests.unit.test_native_ops import threads  # noqa: F401
from worker.model import native_attention
from worker.model.attention import AttentionMetadata, attention_torch, paged_attention_ref

# name -> (num_heads, num_kv_heads, head_dim, window, [(new tokens, cached after the step)])
CASES: dict[str, tuple[int, int, int, int | None, list[tuple[int, int]]]] = {
    "mha_head16": (2, 2, 16, None, [(17, 17), (40, 40), (5, 21)]),
    "gqa_head64": (8, 2, 64, None, [(300, 300), (129, 200), (2, 64), (64, 64)]),
    "mqa_head80": (4, 1, 80, None, [(33, 33), (90, 150)]),
    "gqa_head128_long": (4, 2, 128, None, [(700, 1000), (2, 2)]),
    "odd_group": (6, 3, 32, None, [(31, 31), (7, 77)]),
    "group_of_16": (32, 2, 64, None, [(9, 9), (3, 40)]),
    "group_wider_than_a_tile": (64, 1, 16, None, [(5, 5), (2, 30)]),
    "sliding_window": (4, 2, 16, 20, [(70, 70), (30, 100), (21, 21), (3, 50)]),
    "window_of_one": (2, 1, 16, 1, [(20, 20), (4, 40)]),
}


@pytest.fixture(scope="module")
def kernel() -> native_attention.PrefillKernel:
    built = native_attention.load_prefill()
    assert built is not None, "this machine has a C compiler: the kernel must build"
    return built


def _case(name: str, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Paged caches (``paged_caches``), query offsets, and queries as a view of a wider
    projection."""
    num_heads, num_kv_heads, head_dim, window, seqs = CASES[name]
    k_cache, v_cache, tables = paged_caches(num_kv_heads, head_dim, seqs, window, gen)
    starts = [0]
    for new, _ in seqs:
        starts.append(starts[-1] + new)
    # q: [tokens, Hq, D], a view of [tokens, Hq + 2 Hkv, D] as the fused projection gives
    fused = torch.randn(starts[-1], num_heads + 2 * num_kv_heads, head_dim, generator=gen)
    q = fused[:, :num_heads]
    as_int = [torch.tensor(x, dtype=torch.int32) for x in (starts, [n for _, n in seqs])]
    return (q, k_cache, v_cache, tables, *as_int)


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("name", list(CASES))
def test_prefill_kernel_matches_reference(
    kernel: native_attention.PrefillKernel, name: str
) -> None:
    gen = torch.Generator().manual_seed(len(name))
    q, k_cache, v_cache, tables, starts, lens = _case(name, gen)
    window = CASES[name][3]
    assert kernel.supports(q, k_cache) and not q.is_contiguous()
    out = torch.full(q.shape, float("nan"))
    scale = q.shape[-1] ** -0.5
    kernel.prefill(q, k_cache, v_cache, tables, starts, lens, scale, window, out)
    # the reference reads every block it is given, masked or not: zeros in the null block
    k_ref, v_ref = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    ref = paged_attention_ref(
        q, k_ref, v_ref, starts.tolist(), lens.tolist(), tables, scale, window
    )
    assert torch.isfinite(out).all()
    assert float((out - ref).abs().max()) <= 1e-5


def test_a_step_uses_the_kernel_only_where_it_applies(
    kernel: native_attention.PrefillKernel,
) -> None:
    cache = torch.zeros(3, BLOCK_SIZE, 2, 16)
    assert kernel.supports(torch.zeros(2, 4, 16), cache)
    assert not kernel.supports(torch.zeros(2, 4, 16, dtype=torch.bfloat16), cache.bfloat16())
    assert not kernel.supports(torch.zeros(2, 4, 12), torch.zeros(3, BLOCK_SIZE, 2, 12))
    assert not kernel.supports(torch.zeros(2, 4, 272), torch.zeros(3, BLOCK_SIZE, 2, 272))
    # a step with the kernel and one without (head size 12: torch's SDPA) agree with the
    # reference on the same prompts; the kernel reads the new keys from the cache
    for head_dim in (16, 12):
        gen = torch.Generator().manual_seed(head_dim)
        k_cache = torch.randn(5, BLOCK_SIZE, 2, head_dim, generator=gen)
        v_cache = torch.randn(5, BLOCK_SIZE, 2, head_dim, generator=gen)
        tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        starts, lens = [0, 20, 30], [20, 25]
        q = torch.randn(30, 4, head_dim, generator=gen)
        new_keys = torch.cat([k_cache[:2].flatten(0, 1)[:20], k_cache[2:4].flatten(0, 1)[15:25]])
        new_values = torch.cat([v_cache[:2].flatten(0, 1)[:20], v_cache[2:4].flatten(0, 1)[15:25]])
        meta = AttentionMetadata(
            slot_mapping=torch.zeros(30, dtype=torch.long),  # unused: written already
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            block_tables=tables,
            max_query_len=20,
            max_seq_len=25,
            num_prefills=2,
            num_prefill_tokens=30,
            query_start_loc_host=tuple(starts),
            seq_lens_host=tuple(lens),
            backend="cpu",
            prefill_kernel=kernel,
        )
        scale = head_dim**-0.5
        out = attention_torch(q, new_keys, new_values, k_cache, v_cache, meta, scale, None)
        ref = paged_attention_ref(q, k_cache, v_cache, starts, lens, tables, scale, None)
        assert float((out - ref).abs().max()) <= 1e-5

"""Paged attention: the KV-cache layout, a step's attention metadata, the torch reference path.

Cache layout, per layer: ``k_cache``, ``v_cache``: [num_blocks, block_size, num_kv_heads,
head_dim]. Token ``p`` of a sequence lives in block ``block_table[p // block_size]`` at offset
``p % block_size``, i.e. at *slot* ``block * block_size + offset`` of the flattened cache.

A step's new tokens are flattened ([num_tokens, ...]) sequence after sequence; sequence ``i``
owns tokens ``query_start_loc[i] .. query_start_loc[i+1]`` and, after the step, has
``seq_lens[i]`` tokens in the cache, so its new tokens sit at positions ``seq_lens[i] -
query_len .. seq_lens[i] - 1`` and each attends causally to every cached position up to its
own (within the sliding window, if any). Block tables are padded with a zeroed *null block*,
which also stands in for blocks freed because they lie before the sliding window of every
query (``worker.model.runner``): attention may read such entries, but always masks them out.

Each layer first writes the step's new keys/values into the cache, then attends: so a query
may read keys written in the same step by another sequence (a prefix-cache hit).

Three implementations with identical semantics:

- ``triton``: ``worker.model.kernels`` (CUDA; tested on CPU through the Triton interpreter).
- ``torch``: ``store_kv_ref`` + ``paged_attention_ref`` (the specification, one sequence at a
  time) and ``attention_torch``: the same maths, batched (whole-prompt prefills use the new keys
  directly, decodes are gathered and run as one masked batch).
- ``cpu``: ``attention_torch`` with the C kernels of ``worker.model.native_attention``
  (``AttentionMetadata.decode_kernel``, ``prefill_kernel``), which read the paged cache in place
  (float32); a prompt's keys are read back from the cache, so every new token must have a slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from worker.model.native_attention import DecodeKernel, PrefillKernel

# (k_cache, v_cache) of one layer, each [num_blocks, block_size, num_kv_heads, head_dim]
KVCacheLayer = tuple[torch.Tensor, torch.Tensor]
Backend = Literal["torch", "triton", "cpu"]


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Where a step's tokens come from and go to (built by the model runner)."""

    # [num_tokens] int64: cache slot of each new token
    slot_mapping: torch.Tensor
    # [num_seqs + 1] int32: new tokens of sequence i are [query_start_loc[i], [i+1])
    query_start_loc: torch.Tensor
    # [num_seqs] int32: tokens cached for sequence i once this step's are written
    seq_lens: torch.Tensor
    # [num_seqs, max_blocks] int32: block tables; padding and freed (out-of-window) blocks
    # point at the zeroed null block, only ever read masked
    block_tables: torch.Tensor
    # longest query (new tokens of one sequence) and longest sequence of the step
    max_query_len: int
    max_seq_len: int
    # sequences [0, num_prefills) have more than one new token; the rest exactly one (the
    # torch path runs decodes of similar length together: the runner puts them longest first)
    num_prefills: int
    # tokens of those sequences (they come first in the flat batch)
    num_prefill_tokens: int
    # host copies of query_start_loc and seq_lens (the torch path loops without device syncs)
    query_start_loc_host: tuple[int, ...]
    seq_lens_host: tuple[int, ...]
    # which implementation runs
    backend: Backend = "torch"
    # the "cpu" backend's kernels (loaded once by the runner)
    decode_kernel: DecodeKernel | None = None
    prefill_kernel: PrefillKernel | None = None
    # scratch buffers of the torch path, allocated by the first layer and reused by the others
    workspace: dict[str, torch.Tensor] = field(default_factory=dict)
    # the torch path's per-step plans (decode groups), built by the first layer
    plans: dict[str, Any] = field(default_factory=dict)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: KVCacheLayer,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Write this step's keys/values into the cache, then attend. Returns [num_tokens, Hq, D].

    q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim].
    """
    k_cache, v_cache = kv_cache
    if meta.backend == "triton":
        from worker.model import kernels

        kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return kernels.paged_attention(
            q,
            k_cache,
            v_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            meta.max_query_len,
            scale,
            sliding_window,
        )
    kernel = meta.decode_kernel
    if kernel is not None and kernel.supports(k, k_cache) and kernel.supports(v, v_cache):
        kernel.store(k, v, k_cache, v_cache, meta.slot_mapping)
    else:
        store_kv_ref(k, v, k_cache, v_cache, meta.slot_mapping)
    return attention_torch(q, k, v, k_cache, v_cache, meta, scale, sliding_window)


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Reference KV write: token t goes to slot ``slot_mapping[t]``; slots < 0 are skipped."""
    # k, v: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    # flat caches: [num_blocks * block_size, num_kv_heads, head_dim] (views)
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` cached tokens of one sequence: [seq_len, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    # blocks: [num_blocks, block_size, num_kv_heads, head_dim] (a copy)
    blocks = cache.index_select(0, block_table[:num_blocks])
    return blocks.flatten(0, 1)[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Reference paged attention, everything read from the cache, one sequence at a time.

    q: [num_tokens, num_heads, head_dim]. Returns [num_tokens, num_heads, head_dim].
    """
    out = torch.empty_like(q)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        keys = gather_kv(k_cache, block_tables[i], seq_len)
        values = gather_kv(v_cache, block_tables[i], seq_len)
        out[start:end] = _causal_attention(q[start:end], keys, values, scale, sliding_window)
    return out


def attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """The CPU path (after ``store_kv_ref``): ``paged_attention_ref``'s maths, batched.

    q: [num_tokens, Hq, D]; k, v: this step's [num_tokens, Hkv, D]. Returns [num_tokens, Hq, D].
    """
    out = torch.empty_like(q)
    prefill = meta.prefill_kernel
    if meta.num_prefills and prefill is not None and prefill.supports(q, k_cache):
        # every prompt of the step in one call, keys read back from the cache
        prompts, tokens = slice(0, meta.num_prefills), slice(0, meta.num_prefill_tokens)
        prefill.prefill(
            q[tokens],
            k_cache,
            v_cache,
            meta.block_tables[prompts],
            meta.query_start_loc[: meta.num_prefills + 1],
            meta.seq_lens[prompts],
            scale,
            sliding_window,
            out[tokens],
        )
    else:
        _prompt_attention(q, k, v, k_cache, v_cache, meta, scale, sliding_window, out)
    first = meta.num_prefill_tokens
    if first == q.shape[0]:
        return out
    kernel = meta.decode_kernel
    if kernel is not None and kernel.supports(q, k_cache):
        decodes = slice(meta.num_prefills, None)
        kernel.decode(
            q[first:],
            k_cache,
            v_cache,
            meta.block_tables[decodes],
            meta.seq_lens[decodes],
            scale,
            sliding_window,
            out[first:],
        )
    else:
        out[first:] = _decode_attention(q[first:], k_cache, v_cache, meta, scale, sliding_window)
    return out


def _prompt_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
    out: torch.Tensor,
) -> None:
    """``out``'s prompt rows: one SDPA call per sequence with more than one new token."""
    starts, seq_lens = meta.query_start_loc_host, meta.seq_lens_host
    for i in range(meta.num_prefills):
        start, end = starts[i], starts[i + 1]
        if seq_lens[i] == end - start:
            # nothing cached before: the new keys are the whole sequence (no gather)
            keys, values = k[start:end], v[start:end]
        else:
            keys = gather_kv(k_cache, meta.block_tables[i], seq_lens[i])
            values = gather_kv(v_cache, meta.block_tables[i], seq_lens[i])
        out[start:end] = _causal_attention(q[start:end], keys, values, scale, window)


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None
) -> torch.Tensor:
    """The last ``len(q)`` positions of a sequence attending to all of its ``len(k)`` keys.

    q: [q_len, Hq, D]; k, v: [seq_len, Hkv, D]. Returns [q_len, Hq, D].
    """
    q_len, seq_len = q.shape[0], k.shape[0]
    mask = None
    if q_len != seq_len or (window is not None and seq_len > window):
        # q_pos: [q_len, 1]; k_pos: [1, seq_len]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= q_pos - k_pos < window
        # mask: [q_len, seq_len]
    # SDPA layout: [1, heads, tokens, head_dim]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=mask is None and q_len > 1,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    # out: [1, Hq, q_len, D] -> [q_len, Hq, D]
    return out[0].transpose(0, 1)


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """One new token per sequence; decodes of similar length run as one masked batch.

    q: [num_decodes, Hq, D]. Returns [num_decodes, Hq, D].
    """
    out = torch.empty_like(q)
    for g in _decode_plan(meta, k_cache.shape[1], window, q.device, q.dtype):
        # gathered blocks: [group_size * max_blocks, block_size, Hkv, D], reused across layers
        shape = (g.num_seqs * g.max_blocks, *k_cache.shape[1:])
        keys, values = (_scratch(meta, f"decode{g.start}{kv}", shape, k_cache) for kv in "kv")
        torch.index_select(k_cache, 0, g.block_index, out=keys)
        torch.index_select(v_cache, 0, g.block_index, out=values)
        rows = slice(g.start, g.start + g.num_seqs)
        out[rows] = _decode_group(q[rows], keys, values, g.mask, scale)
    return out


@dataclass(frozen=True, slots=True)
class _DecodeGroup:
    """Decodes [start, start + num_seqs) of a step (among the decodes), run as one batch."""

    start: int
    num_seqs: int
    # blocks every row is padded to
    max_blocks: int
    # [num_seqs * max_blocks] int: the rows' block tables, flattened (what to gather)
    block_index: torch.Tensor
    # [num_seqs, 1, 1, max_blocks * block_size]: 0 for the keys each row sees, -inf elsewhere
    mask: torch.Tensor


def _decode_plan(
    meta: AttentionMetadata,
    block_size: int,
    window: int | None,
    device: torch.device,
    q_dtype: torch.dtype,
) -> list[_DecodeGroup]:
    """The step's decode groups, built by the first layer and kept in the step's workspace
    (every layer with the same window shares them)."""
    key = f"decode_plan{window}"
    plan: list[_DecodeGroup] | None = meta.plans.get(key)
    if plan is not None:
        return plan
    first = meta.num_prefills
    seq_lens = meta.seq_lens_host[first:]
    num_blocks = [-(-n // block_size) for n in seq_lens]
    plan = []
    for start, stop in _length_groups(num_blocks):
        max_blocks = max(num_blocks[start:stop])
        tables = meta.block_tables[first + start : first + stop, :max_blocks]
        # lens: [n, 1]; k_pos: [1, max_len]
        lens = meta.seq_lens[first + start : first + stop].to(torch.long)[:, None]
        k_pos = torch.arange(max_blocks * block_size, device=device)[None, :]
        visible = k_pos < lens
        if window is not None:
            visible &= k_pos >= lens - window
        # additive: SDPA turns a boolean mask into this on every call otherwise
        mask = torch.zeros(visible.shape, dtype=q_dtype, device=device)
        mask.masked_fill_(~visible, float("-inf"))
        plan.append(
            _DecodeGroup(start, stop - start, max_blocks, tables.flatten(), mask[:, None, None])
        )
    meta.plans[key] = plan
    return plan


def _scratch(
    meta: AttentionMetadata, name: str, shape: tuple[int, ...], like: torch.Tensor
) -> torch.Tensor:
    buf = meta.workspace.get(name)
    if buf is None or buf.shape != shape:
        buf = meta.workspace[name] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return buf


def _length_groups(num_blocks: list[int], max_groups: int = 4) -> list[tuple[int, int]]:
    """Consecutive runs [start, stop) of decodes, so that padding every row of a run to its
    longest wastes little (gathering padded blocks is most of the CPU decode cost). The runner
    puts decodes longest first, so runs of similar length are consecutive."""
    groups: list[tuple[int, int]] = []
    start = 0
    longest = max(num_blocks, default=0)
    for i, n in enumerate(num_blocks):
        # a new run once a row is under 3/4 of the run's longest (at most max_groups runs)
        if i > start and len(groups) < max_groups - 1 and n * 4 < longest * 3:
            groups.append((start, i))
            start, longest = i, n
        longest = max(longest, n)
    if num_blocks:
        groups.append((start, len(num_blocks)))
    return groups


def _decode_group(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [n, Hq, D]; keys, values: the rows' blocks [n * max_blocks, block_size, Hkv, D];
    mask: [n, 1, 1, max_len]. Returns [n, Hq, D]."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[2]
    max_len = keys.shape[0] * keys.shape[1] // num_seqs
    # keys, values: [n, Hkv, max_len, D] (views)
    keys = keys.view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    values = values.view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    # GQA without repeating keys: the query heads of one kv head act as its "query tokens"
    # q: [n, Hkv, group, D]
    group = num_heads // num_kv_heads
    out = F.scaled_dot_product_attention(
        q.reshape(num_seqs, num_kv_heads, group, head_dim),
        keys,
        values,
        attn_mask=mask,
        scale=scale,
    )
    # out: [n, Hkv, group, D] -> [n, Hq, D]
    return out.reshape(num_seqs, num_heads, head_dim)

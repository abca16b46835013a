"""Runs the engine's scheduled steps on the model: builds the flat batch, owns the KV cache,
samples.

The KV cache is allocated once at start: per layer ``(k_cache, v_cache)``, each [num_blocks + 1,
block_size, num_kv_heads, head_dim] in the model's dtype. Its size comes from the engine config:
an explicit block count or byte size, else on CUDA a share of the free device memory, else
(CPU) room for ``max_num_seqs`` full-length sequences, capped. The extra last block is the
*null block*: never handed out, never written, all zeros; block-table padding and
``NULL_BLOCK`` placeholders (blocks freed out of a sliding window) point at it, so the reads
attention masks out are always of finite values.

Example:

    >>> runner = ModelRunner(model, EngineConfig(kv_cache_bytes=256 << 20))
    >>> runner.cache.num_blocks
    >>> results = runner.execute(scheduler_output)  # one SampleResult per sampling sequence
"""

from __future__ import annotations

import logging
import os

import torch

from common.model_config import ModelConfig
from worker.engine.block_manager import NULL_BLOCK
from worker.engine.config import DEFAULT_CPU_KV_CACHE_BYTES, CacheSpec, EngineConfig
from worker.engine.outputs import SampleResult
from worker.engine.sampling import is_plain_greedy, request_generator, sample_batch
from worker.engine.scheduler import ScheduledSequence, SchedulerOutput
from worker.engine.sequence import Sequence
from worker.model import native_attention, native_ops
from worker.model.attention import AttentionMetadata, Backend, KVCacheLayer
from worker.model.greedy_head import GreedyHead
from worker.model.host_memory import keep_freed_memory
from worker.model.llama import LlamaModel
from worker.model.packed_linear import pack_linears

log = logging.getLogger(__name__)


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers (keys and values)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return per_token * block_size * itemsize


def kv_cache_num_blocks(
    model_config: ModelConfig,
    config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
) -> int:
    """How many blocks the KV cache gets (see the module doc)."""
    block_bytes = kv_block_bytes(model_config, config.block_size, dtype)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_bytes is not None:
        budget = config.kv_cache_bytes
    elif device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        budget = int(free_bytes * config.kv_cache_memory_fraction)
    else:
        wanted = config.max_num_seqs * -(-max_model_len // config.block_size) * block_bytes
        budget = min(wanted, DEFAULT_CPU_KV_CACHE_BYTES)
    num_blocks = budget // block_bytes
    if num_blocks < 1:
        raise ValueError(
            f"kv cache: a budget of {budget} bytes holds no block ({block_bytes} bytes each)"
        )
    return num_blocks


def freeable_sliding_window(config: ModelConfig) -> int | None:
    """The window past which KV blocks may be freed: only when every layer slides (a
    full-attention layer reads every key of the sequence)."""
    if len(config.sliding_window_layers) < config.num_hidden_layers:
        return None
    return config.sliding_window


def resolve_backend(
    requested: str, device: torch.device, dtype: torch.dtype = torch.float32
) -> Backend:
    if requested == "cpu" or (requested == "auto" and device.type != "cuda"):
        usable = device.type == "cpu" and dtype == torch.float32
        if usable and native_attention.load() is not None:
            return "cpu"
        if requested == "cpu":
            raise ValueError(
                "attention_backend: 'cpu' needs a float32 model on CPU and a C compiler "
                "(its kernel is built on first use)"
            )
        return "torch"
    if requested == "torch":
        return "torch"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "attention_backend: 'triton' needs a CUDA device (or TRITON_INTERPRET=1 on CPU)"
        )
    return "triton"


class ModelRunner:
    """Executes ``SchedulerOutput``s on one model; satisfies ``llm_engine.Runner``."""

    def __init__(self, model: LlamaModel, config: EngineConfig) -> None:
        mc = model.config
        max_model_len = config.max_model_len or mc.max_position_embeddings
        if max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len: {max_model_len} exceeds the model's max_position_embeddings "
                f"({mc.max_position_embeddings})"
            )
        self.model = model
        self.device = model.inv_freq.device
        self.dtype = model.model.embed_tokens.weight.dtype
        self.backend = resolve_backend(config.attention_backend, self.device, self.dtype)
        num_blocks = kv_cache_num_blocks(mc, config, self.dtype, self.device, max_model_len)
        self.cache = CacheSpec(
            num_blocks, config.block_size, max_model_len, freeable_sliding_window(mc)
        )
        # the null block (module doc): one past the blocks the block manager hands out
        self.null_block = num_blocks
        shape = (num_blocks + 1, config.block_size, mc.num_key_value_heads, mc.head_dim)
        # NOTE: zeros, not empty: padded and placeholder block-table entries are read (then
        # masked) by the torch path, and 0 * NaN garbage would poison the output.
        self.kv_caches: list[KVCacheLayer] = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(mc.num_hidden_layers)
        ]
        # the "cpu" backend's kernels, loaded once (resolve_backend has built the decode one;
        # prompts fall back to torch's SDPA where the prefill one cannot be built)
        self._decode_kernel = self._prefill_kernel = self._row_ops = None
        if self.backend == "cpu":
            self._decode_kernel = native_attention.load()
            self._prefill_kernel = native_attention.load_prefill()
            # RMSNorm, rotary embeddings and greedy argmax in C too (worker.model.native_ops)
            self._row_ops = native_ops.load()
            native_ops.attach(model, self._row_ops)
        self._generators: dict[str, torch.Generator | None] = {}
        # CPU: freed intermediates kept for the next step (worker.model.host_memory), and the
        # linear layers' weights reordered into oneDNN's blocked layout
        # (worker.model.packed_linear) after the first step: the reorder (~0.1 s per 50M
        # parameters) stays off a cold start's first token
        if self.device.type == "cpu":
            keep_freed_memory()
        self._packed = False
        # greedy rows' tokens from a bfloat16 screen of the LM head (worker.model.greedy_head),
        # where the CPU has bfloat16 units; built with the reorder below
        self.greedy_head: GreedyHead | None = None
        log.info(
            "KV cache: %d blocks of %d tokens (%d bytes), attention backend %s",
            num_blocks,
            config.block_size,
            num_blocks * kv_block_bytes(mc, config.block_size, self.dtype),
            self.backend,
        )

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def execute(self, out: SchedulerOutput) -> list[SampleResult]:
        """Run one step; one result per scheduled sequence that samples, in schedule order."""
        results = self._execute(out)
        if not self._packed:
            # the greedy screen keeps the head's plain weight: built before the reorder
            weight = getattr(self.model.lm_head, "weight", None)
            if self._row_ops is not None and isinstance(weight, torch.Tensor):
                self.greedy_head = GreedyHead.build(weight)
            pack_linears(self.model)
            self._packed = True
        return results

    def _execute(self, out: SchedulerOutput) -> list[SampleResult]:
        # sequences with several new tokens first: the torch path handles them one by one and
        # the single-token ones (decodes) in batches of similar length, longest first
        prefills = [s for s in out.scheduled if s.num_new_tokens > 1]
        decodes = sorted(
            (s for s in out.scheduled if s.num_new_tokens == 1),
            key=lambda s: -s.seq.num_computed_tokens,
        )
        ordered = prefills + decodes
        input_ids, positions, meta = self._prepare(ordered, num_prefills=len(prefills))
        # last token of each sampling sequence, in schedule order
        last_index = {
            id(s.seq): meta.query_start_loc_host[i + 1] - 1 for i, s in enumerate(ordered)
        }
        sampling = [s for s in out.scheduled if s.samples]
        if not sampling:
            with torch.inference_mode():
                self.model(input_ids, positions, self.kv_caches, meta)
            return []
        rows = torch.tensor([last_index[id(s.seq)] for s in sampling], device=self.device)
        with torch.inference_mode():
            # hidden: [num_tokens, hidden]
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
            seqs = [s.seq for s in sampling]
            for seq in seqs:
                if seq.request_id not in self._generators:
                    self._generators[seq.request_id] = request_generator(seq.params, self.device)
            generators = [self._generators[seq.request_id] for seq in seqs]
            # structured outputs' masks, computed while the model ran (waits if they are not)
            banned = () if out.masks is None else out.masks.of([s.request_id for s in seqs])
            return self._sample(hidden[rows], seqs, generators, banned)

    def _sample(
        self,
        hidden: torch.Tensor,
        seqs: list[Sequence],
        generators: list[torch.Generator | None],
        banned: torch.Tensor | list[torch.Tensor | None] | tuple[()],
    ) -> list[SampleResult]:
        """Each sequence's next token from its last hidden state (hidden: [len(seqs), hidden]):
        plain greedy rows through the greedy screen where there is one, the rest (and the rows
        it leaves undecided) from their full logits."""
        params = [seq.params for seq in seqs]
        results: list[SampleResult | None] = [None] * len(seqs)
        if self.greedy_head is not None and not isinstance(banned, torch.Tensor):
            screened = [
                i
                for i, p in enumerate(params)
                if is_plain_greedy(p) and (not banned or banned[i] is None)
            ]
            if screened:
                rows = hidden if len(screened) == len(seqs) else hidden[screened]
                tokens = self.greedy_head.argmax(rows)
                for i, token in zip(screened, tokens, strict=True):
                    if token is not None:
                        results[i] = SampleResult(token)
        rest = [i for i, r in enumerate(results) if r is None]
        if rest:
            # logits: [len(rest), vocab]
            logits = self.model.compute_logits(hidden if len(rest) == len(seqs) else hidden[rest])
            sampled = sample_batch(
                logits,
                [params[i] for i in rest],
                [generators[i] for i in rest],
                [seqs[i].token_ids for i in rest],
                [seqs[i].num_prompt_tokens for i in rest],
                banned
                if isinstance(banned, torch.Tensor) or not banned
                else [banned[i] for i in rest],
                argmax=None if self._row_ops is None else self._row_ops.argmax,
            )
            for i, result in zip(rest, sampled, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def _prepare(
        self, ordered: list[ScheduledSequence], num_prefills: int
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        block_size = self.cache.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        for s in ordered:
            seq = s.seq
            start = seq.num_computed_tokens
            end = start + s.num_new_tokens
            table = seq.block_table
            # new tokens never go to a placeholder: those lie before every future query's window
            assert table[start // block_size] != NULL_BLOCK, f"{seq} writes to a freed block"
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(
                table[p // block_size] * block_size + p % block_size for p in range(start, end)
            )
            query_start_loc.append(query_start_loc[-1] + s.num_new_tokens)
            seq_lens.append(end)
        max_blocks = max(len(s.seq.block_table) for s in ordered)
        null = self.null_block
        block_tables = []
        for s in ordered:
            table = s.seq.block_table
            # NOTE: placeholders only ever form a prefix of a table (BlockManager invariant)
            if table and table[0] == NULL_BLOCK:
                table = [null if b == NULL_BLOCK else b for b in table]
            block_tables.append(table + [null] * (max_blocks - len(table)))
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(block_tables, dtype=torch.int32, device=dev),
            max_query_len=max(s.num_new_tokens for s in ordered),
            max_seq_len=max(seq_lens),
            num_prefills=num_prefills,
            num_prefill_tokens=query_start_loc[num_prefills],
            query_start_loc_host=tuple(query_start_loc),
            seq_lens_host=tuple(seq_lens),
            backend=self.backend,
            decode_kernel=self._decode_kernel,
            prefill_kernel=self._prefill_kernel,
        )
        return (
            torch.tensor(input_ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta,
        )

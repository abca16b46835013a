"""Triton kernels against the torch reference: KV-cache writes and paged attention (decodes,
whole prompts, chunks after cached context; MHA/GQA/MQA; sliding window; fp32/fp16; block
tables with blocks freed out of the window), and whole engine runs on the Triton backend
against the torch backend (one freeing blocks out of a sliding window).

On CPU the kernels run in Triton's interpreter, which must be switched on before triton is
first imported: the checks run in a child process with ``TRITON_INTERPRET=1``. On a GPU
(tests marked ``gpu``) they run compiled, in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]

# name -> (num_heads, num_kv_heads, head_dim, dtype, window, [(query_len, seq_len), ...])
ATTENTION_CASES: dict[str, tuple[int, int, int, str, int | None, list[tuple[int, int]]]] = {
    "decode_mha": (2, 2, 16, "float32", None, [(1, 1), (1, 17), (1, 40)]),
    "prefill_gqa": (4, 2, 16, "float32", None, [(5, 5), (20, 20)]),
    "chunk_after_context_mqa": (4, 1, 12, "float32", None, [(3, 20), (18, 35), (1, 9)]),
    "sliding_window": (2, 1, 16, "float32", 7, [(20, 20), (4, 30), (1, 33)]),
    "float16_mixed": (4, 2, 16, "float16", None, [(6, 6), (2, 19), (1, 16)]),
}
BLOCK_SIZE = 16


def _attention_case(name: str, device: str) -> float:
    from worker.model import kernels
    from worker.model.attention import paged_attention_ref, store_kv_ref

    num_heads, num_kv_heads, head_dim, dtype_name, window, seqs = ATTENTION_CASES[name]
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    num_blocks = sum(-(-seq_len // BLOCK_SIZE) for _, seq_len in seqs) + 3
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    # scattered, shuffled block tables
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots, starts, lens = [], [], [0], []
    max_blocks = max(-(-s // BLOCK_SIZE) for _, s in seqs)
    for query_len, seq_len in seqs:
        table = [free.pop() for _ in range(-(-seq_len // BLOCK_SIZE))]
        tables.append(table + [0] * (max_blocks - len(table)))
        slots += [
            table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
            for p in range(seq_len - query_len, seq_len)
        ]
        starts.append(starts[-1] + query_len)
        lens.append(seq_len)
    num_tokens = starts[-1]
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    slot_mapping = torch.tensor(slots)
    block_tables = torch.tensor(tables, dtype=torch.int32)

    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(k, v, ref_k, ref_v, slot_mapping)
    # the reference in float32, from the same (written) cache
    scale = head_dim**-0.5
    ref = paged_attention_ref(
        q.float(), ref_k.float(), ref_v.float(), starts, lens, block_tables, scale, window
    )

    dev = torch.device(device)
    k_dev, v_dev = k_cache.to(dev), v_cache.to(dev)
    kernels.store_kv(k.to(dev), v.to(dev), k_dev, v_dev, slot_mapping.to(dev))
    assert torch.equal(k_dev.cpu(), ref_k) and torch.equal(v_dev.cpu(), ref_v), "store_kv"
    out = kernels.paged_attention(
        q.to(dev),
        k_dev,
        v_dev,
        torch.tensor(starts, dtype=torch.int32, device=dev),
        torch.tensor(lens, dtype=torch.int32, device=dev),
        block_tables.to(dev),
        max(ql for ql, _ in seqs),
        scale,
        window,
    )
    return float((out.cpu().float() - ref).abs().max())


def _placeholder_case(device: str) -> dict[str, float]:
    """Blocks freed out of the sliding window: their block-table entries point at a null block.

    The reference reads the real blocks; Triton gets a null block full of NaN (it must never
    load it: any read, even masked, would leak NaN through p @ v), the torch reference a
    zeroed one (it reads it masked, as the runner's cache guarantees). Returns max errors.
    """
    from worker.model import kernels
    from worker.model.attention import paged_attention_ref

    num_heads, num_kv_heads, head_dim, window = 2, 1, 16, 20
    # (query_len, seq_len): a decode, a short chunk, a chunk of two query tiles
    seqs = [(1, 70), (4, 50), (20, 60)]
    gen = torch.Generator().manual_seed(1)
    num_blocks = sum(-(-seq_len // BLOCK_SIZE) for _, seq_len in seqs)
    null = num_blocks  # one past the real blocks, as in the runner
    shape = (num_blocks + 1, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(-(-s // BLOCK_SIZE) for _, s in seqs)
    tables, freed_tables, starts, lens = [], [], [0], []
    for query_len, seq_len in seqs:
        table = [free.pop() for _ in range(-(-seq_len // BLOCK_SIZE))]
        # what BlockManager.num_out_of_window frees before this step
        num_freed = max(seq_len - query_len - window + 1, 0) // BLOCK_SIZE
        assert num_freed >= 1
        pad = [null] * (max_blocks - len(table))
        tables.append(table + pad)
        freed_tables.append([null] * num_freed + table[num_freed:] + pad)
        starts.append(starts[-1] + query_len)
        lens.append(seq_len)
    q = torch.randn(starts[-1], num_heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    ref = paged_attention_ref(
        q, k_cache, v_cache, starts, lens, torch.tensor(tables, dtype=torch.int32), scale, window
    )
    freed = torch.tensor(freed_tables, dtype=torch.int32)
    k_cache[null], v_cache[null] = 0.0, 0.0
    torch_out = paged_attention_ref(q, k_cache, v_cache, starts, lens, freed, scale, window)
    k_cache[null], v_cache[null] = float("nan"), float("nan")
    dev = torch.device(device)
    triton_out = kernels.paged_attention(
        q.to(dev),
        k_cache.to(dev),
        v_cache.to(dev),
        torch.tensor(starts, dtype=torch.int32, device=dev),
        torch.tensor(lens, dtype=torch.int32, device=dev),
        freed.to(dev),
        max(ql for ql, _ in seqs),
        scale,
        window,
    )
    return {
        "triton": float((triton_out.cpu() - ref).abs().max()),
        "torch": float((torch_out - ref).abs().max()),
    }


def _skipped_slots(device: str) -> bool:
    from worker.model import kernels

    dev = torch.device(device)
    cache = torch.zeros(4, BLOCK_SIZE, 1, 16, device=dev)
    k = torch.ones(3, 1, 16, device=dev)
    kernels.store_kv(k, k, cache, cache.clone(), torch.tensor([5, -1, 40], device=dev))
    written = (cache.flatten(0, 1)[:, 0, 0] == 1).nonzero().flatten().tolist()
    return bool(written == [5, 40])


def _engine_tokens(device: str, backend: str, window: int | None = None) -> list[list[int]]:
    """Greedy tokens of a tiny random Llama through the whole engine; with ``window``, a
    Mistral whose sequences outgrow it, so that blocks are freed (asserted)."""
    from common.model_config import ModelConfig
    from worker.engine.block_manager import NULL_BLOCK
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.params import SamplingParams
    from worker.model.demo import init_model, load_corpus, train_tokenizer

    tokenizer = train_tokenizer(load_corpus()[:20])
    config = ModelConfig.from_hf_dict(
        {
            "model_type": "llama" if window is None else "mistral",
            "vocab_size": tokenizer.get_vocab_size(),
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 64,
            "initializer_range": 0.1,
            "sliding_window": window,
        }
    )
    model = init_model(config, torch.Generator().manual_seed(0)).eval().to(device)
    model.requires_grad_(False)
    engine_config = EngineConfig(
        block_size=BLOCK_SIZE, num_kv_blocks=8, max_num_batched_tokens=12, attention_backend=backend
    )
    engine = LLMEngine.from_model(model, tokenizer, (), engine_config)
    prompts = ["The river ran", "Snow falls on the high mountain pass tonight"]
    max_tokens = 4 if window is None else 40
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), engine.encode(prompt), SamplingParams(max_tokens=max_tokens))
    tokens: list[list[int]] = [[] for _ in prompts]
    freed = False
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[int(out.request_id)].extend(out.new_token_ids)
        freed |= any(NULL_BLOCK in seq.block_table for seq in engine.scheduler.running)
    assert freed == (window is not None)
    return tokens


def check_all(device: str) -> dict[str, Any]:
    """Every comparison (run in the child process on CPU, in this one on a GPU)."""
    results: dict[str, Any] = {name: _attention_case(name, device) for name in ATTENTION_CASES}
    results["placeholders"] = _placeholder_case(device)
    results["skipped_slots"] = _skipped_slots(device)
    results["engine"] = [_engine_tokens(device, "triton"), _engine_tokens(device, "torch")]
    results["engine_window"] = [
        _engine_tokens(device, "triton", window=16),
        _engine_tokens(device, "torch", window=16),
    ]
    return results


def _tolerance(case: str) -> float:
    return 2e-3 if ATTENTION_CASES[case][3] == "float16" else 1e-5


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    code = (
        "import json; from tests.unit.test_kernels import check_all; "
        "print(json.dumps(check_all('cpu')))"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_paged_attention_matches_reference_in_the_interpreter(
    interpreted: dict[str, Any], case: str
) -> None:
    assert interpreted[case] <= _tolerance(case)


def test_freed_blocks_are_never_read_unmasked_in_the_interpreter(
    interpreted: dict[str, Any],
) -> None:
    assert interpreted["placeholders"]["triton"] <= 1e-5  # never loaded at all (NaN there)
    assert interpreted["placeholders"]["torch"] <= 1e-5  # read masked: the zeros are harmless


def test_engine_freeing_window_blocks_on_triton_matches_torch_path(
    interpreted: dict[str, Any],
) -> None:
    triton_tokens, torch_tokens = interpreted["engine_window"]
    assert triton_tokens == torch_tokens
    assert all(len(t) == 40 for t in torch_tokens)


def test_store_kv_skips_negative_slots_in_the_interpreter(interpreted: dict[str, Any]) -> None:
    assert interpreted["skipped_slots"] is True


def test_engine_on_triton_kernels_matches_torch_path(interpreted: dict[str, Any]) -> None:
    triton_tokens, torch_tokens = interpreted["engine"]
    assert triton_tokens == torch_tokens
    assert all(len(t) == 4 for t in torch_tokens)


def test_triton_backend_needs_cuda_or_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.model.runner import resolve_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    assert resolve_backend("torch", cpu) == "torch"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_backend("triton", cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("triton", cpu) == "triton"
    assert resolve_backend("auto", torch.device("cuda")) == "triton"


@pytest.mark.gpu
def test_kernels_match_reference_on_gpu() -> None:
    results = check_all("cuda")
    for case in ATTENTION_CASES:
        assert results[case] <= _tolerance(case), case
    assert results["skipped_slots"] is True
    assert results["engine"][0] == results["engine"][1]
    assert max(results["placeholders"].values()) <= 1e-5
    assert results["engine_window"][0] == results["engine_window"][1]

"""Sliding-window KV freeing on a real model: the engine against ``transformers`` on a Mistral
checkpoint whose window is far shorter than prompt + generation.

Blocks wholly before the window of every future query are freed as sequences advance; the
greedy tokens must stay exactly those of ``transformers.generate``, each sequence must hold a
bounded number of blocks however long it gets, and a rerun must resume from prefix-cache hits
on the blocks inside the window only.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from common.model_config import ModelConfig
from tests.unit.hf_reference import _id_tokenizer, _our_model
from worker.engine.block_manager import NULL_BLOCK
from worker.engine.config import EngineConfig
from worker.engine.errors import PromptTooLongError
from worker.engine.llm_engine import LLMEngine
from worker.engine.params import SamplingParams
from worker.engine.scheduler import SchedulerOutput
from worker.model.llama import LlamaModel
from worker.model.runner import freeable_sliding_window

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 128
WINDOW = 32
NEW_TOKENS = 60


def _prompts() -> list[list[int]]:
    """Prompts of 90 and 75 tokens (both beyond the window) and one within it."""
    rng = torch.Generator().manual_seed(11)

    def rand(n: int) -> list[int]:
        return [int(t) for t in torch.randint(2, VOCAB_SIZE, (n,), generator=rng)]

    return [[0, *rand(89)], [0, *rand(74)], [0, *rand(9)]]


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaModel, list[list[int]]]:
    """Our model and transformers' greedy tokens for every prompt."""
    path = tmp_path_factory.mktemp("mistral_window")
    config = transformers.MistralConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=WINDOW,
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(99)
    transformers.MistralForCausalLM(config).save_pretrained(path)
    hf_model = transformers.MistralForCausalLM.from_pretrained(path).eval()
    expected = []
    for prompt in PROMPTS:
        input_ids = torch.tensor([prompt])
        out = hf_model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
        )
        expected.append(out[0, len(prompt) :].tolist())
    return _our_model(path), expected


def _run(
    model: LlamaModel, config: EngineConfig, rounds: int = 1
) -> tuple[list[list[int]], LLMEngine, int, dict[str, int]]:
    """Generate for every prompt (all at once, ``rounds`` times, one round after the other).

    Returns the tokens per request, the engine, the most blocks any sequence held during a
    step, and the prompt tokens each request found cached."""
    engine = LLMEngine.from_model(model, _id_tokenizer(), (), config)
    max_held = 0
    schedule = engine.scheduler.schedule

    def schedule_and_measure() -> SchedulerOutput:
        nonlocal max_held
        out = schedule()
        for s in out.scheduled:  # blocks held while the step runs: the peak
            max_held = max(max_held, sum(b != NULL_BLOCK for b in s.seq.block_table))
        return out

    engine.scheduler.schedule = schedule_and_measure  # type: ignore[method-assign]
    tokens: dict[str, list[int]] = defaultdict(list)
    cached: dict[str, int] = {}
    for r in range(rounds):
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"{r}-{i}", prompt, SamplingParams(max_tokens=NEW_TOKENS))
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
                if out.finished:
                    cached[out.request_id] = out.num_cached_tokens
            live = engine.scheduler.running + engine.scheduler.waiting
            engine.block_manager.check_invariants(live)
    assert engine.block_manager.num_free_blocks == engine.cache.num_blocks, "blocks leaked"
    order = [f"{r}-{i}" for r in range(rounds) for i in range(len(PROMPTS))]
    return [tokens[rid] for rid in order], engine, max_held, cached


@pytest.mark.parametrize("block_size", [4, 8])
def test_freed_blocks_keep_greedy_tokens_and_bound_the_blocks_held(
    mistral: tuple[LlamaModel, list[list[int]]], block_size: int
) -> None:
    model, expected = mistral
    # the budget is one block: a prompt chunk never spans more than two blocks
    config = EngineConfig(
        block_size=block_size,
        max_num_batched_tokens=block_size,
        num_kv_blocks=160 // block_size,
        enable_prefix_caching=False,
    )
    tokens, engine, max_held, _ = _run(model, config)
    assert engine.cache.sliding_window == WINDOW
    assert tokens == expected
    # 150 tokens are 38 (or 19) blocks; a sequence holds at most the window's worth, plus a
    # block at either end
    assert max_held <= WINDOW // block_size + 2
    # three sequences of 150 tokens on a cache of 160 tokens: none had to be preempted
    assert engine.stats().num_preemptions == 0


def test_a_request_longer_than_the_cache_runs_when_the_window_fits(
    mistral: tuple[LlamaModel, list[list[int]]],
) -> None:
    model, expected = mistral
    # 150 tokens on a 96-token cache: a step holds at most (16 + 31) // 8 + 2 = 7 blocks
    config = EngineConfig(block_size=8, max_num_batched_tokens=16, num_kv_blocks=12)
    engine = LLMEngine.from_model(model, _id_tokenizer(), (), config)
    params = SamplingParams(max_tokens=NEW_TOKENS)
    engine.add_request("long", PROMPTS[0], params)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    assert tokens == expected[0]
    # a budget that lets one step need more blocks than the cache has is refused up front
    wide = EngineConfig(block_size=8, max_num_batched_tokens=128, num_kv_blocks=12)
    engine = LLMEngine.from_model(model, _id_tokenizer(), (), wide)
    with pytest.raises(PromptTooLongError, match="KV cache"):
        engine.add_request("long", PROMPTS[0], params)


def test_a_rerun_resumes_from_the_blocks_inside_the_window(
    mistral: tuple[LlamaModel, list[list[int]]],
) -> None:
    model, expected = mistral
    config = EngineConfig(block_size=4, max_num_batched_tokens=64, num_kv_blocks=256)
    tokens, engine, _, cached = _run(model, config, rounds=2)
    assert tokens == expected * 2
    # the second round finds every full prompt block but the one holding the last token; it
    # took references on the window's blocks only
    for i, prompt in enumerate(PROMPTS):
        assert cached[f"1-{i}"] == (len(prompt) - 1) // 4 * 4
    assert engine.stats().prefix_cache.hits > 0


def test_blocks_are_freed_only_when_every_layer_slides(tmp_path: Path) -> None:
    base: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "sliding_window": WINDOW,
    }
    mistral = ModelConfig.from_hf_dict({**base, "model_type": "mistral"})
    assert freeable_sliding_window(mistral) == WINDOW
    qwen = {**base, "model_type": "qwen2", "use_sliding_window": True}
    # layers 2 and 3 slide, 0 and 1 attend to everything: nothing may be freed
    mixed = ModelConfig.from_hf_dict({**qwen, "max_window_layers": 2})
    assert mixed.sliding_window_layers == {2, 3}
    assert freeable_sliding_window(mixed) is None
    assert freeable_sliding_window(ModelConfig.from_hf_dict({**qwen, "max_window_layers": 0}))
    assert (
        freeable_sliding_window(ModelConfig.from_hf_dict({**base, "model_type": "qwen2"})) is None
    )

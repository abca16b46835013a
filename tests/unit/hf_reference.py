"""Reference models for the engine's differential tests: small random-weight checkpoints of every
supported architecture written with ``transformers``' ``save_pretrained`` (fp32), their greedy
tokens and logits from ``transformers.generate``, and the engine run over the same prompts with
the block books checked every step.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers

from common.model_config import ModelConfig
from worker.engine.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.params import SamplingParams
from worker.model.llama import LlamaModel
from worker.model.weights import build_model

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 128
NEW_TOKENS = 14
BLOCK_SIZE = 4

# name -> (config class, model class, architecture-specific config)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama_gqa": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "llama_mqa_tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "llama3_rope_scaling": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "num_key_value_heads": 2,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "mistral_sliding_window": (
        "MistralConfig",
        "MistralForCausalLM",
        {"num_key_value_heads": 2, "sliding_window": 8},
    ),
    "qwen2_qkv_bias": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "qwen3_qk_norm": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"num_key_value_heads": 2, "head_dim": 32, "attention_bias": True},
    ),
}


def _prompts() -> list[list[int]]:
    """Varied lengths; the last two share full blocks with the third (prefix-cache hits)."""
    rng = torch.Generator().manual_seed(7)

    def rand(n: int) -> list[int]:
        return [int(t) for t in torch.randint(2, VOCAB_SIZE, (n,), generator=rng)]

    base = [0, *rand(39)]
    return [[0], [0, *rand(6)], base, [0, *rand(44)], base[:36] + rand(6), base + rand(3)]


PROMPTS = _prompts()


@dataclass
class Case:
    name: str
    hf_model: Any
    model: LlamaModel
    # per prompt: greedy tokens and per-step logits of transformers
    hf_tokens: list[list[int]]
    hf_logits: list[torch.Tensor]


def _save_hf_model(name: str, path: Path) -> Any:
    config_cls, model_cls, extra = ARCHITECTURES[name]
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        # larger than the default 0.02, so the top two logits are never near-ties
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=None,  # no early stop: always NEW_TOKENS tokens to compare
        pad_token_id=None,
        **extra,
    )
    torch.manual_seed(1234)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():  # biases init to 0 and norms to 1: make them matter
        for pname, param in model.named_parameters():
            if pname.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif pname.endswith("norm.weight"):
                param.normal_(1.0, 0.1)
    model.save_pretrained(path)
    return getattr(transformers, model_cls).from_pretrained(path).eval()


def _our_model(checkpoint: Path, dtype: torch.dtype | None = None) -> LlamaModel:
    config = ModelConfig.from_hf_dict(json.loads((checkpoint / "config.json").read_text()))
    return build_model(config, load_file(str(checkpoint / "model.safetensors")), dtype)


def _hf_greedy(hf_model: Any, prompt_ids: list[int]) -> tuple[list[int], torch.Tensor]:
    input_ids = torch.tensor([prompt_ids])
    out = hf_model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        output_logits=True,
        return_dict_in_generate=True,
    )
    # logits: [NEW_TOKENS, vocab]
    return out.sequences[0, len(prompt_ids) :].tolist(), torch.stack(out.logits)[:, 0]


def _id_tokenizer() -> Tokenizer:
    """Token ``t{i}`` is id i: enough for the engine to detokenize arbitrary ids."""
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB_SIZE)}, "t1"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def run_engine(
    model: LlamaModel,
    prompts: Sequence[list[int]],
    config: EngineConfig,
    params: SamplingParams,
    rounds: int = 1,
    one_at_a_time: bool = False,
) -> tuple[list[list[int]], LLMEngine, list[Any]]:
    """Generate for every prompt (``rounds`` times); check the block books every step.

    Returns the tokens per request, the engine and every output (in order)."""
    engine = LLMEngine.from_model(model, _id_tokenizer(), (), config)
    tokens: dict[str, list[int]] = defaultdict(list)
    outputs = []
    order = []
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            request_id = f"{r}-{i}"
            order.append(request_id)
            engine.add_request(request_id, prompt, params)
            while engine.has_unfinished_requests() and (one_at_a_time or i == len(prompts) - 1):
                for out in engine.step():
                    tokens[out.request_id].extend(out.new_token_ids)
                    outputs.append(out)
                live = engine.scheduler.running + engine.scheduler.waiting
                engine.block_manager.check_invariants(live)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.cache.num_blocks, "blocks leaked"
    return [tokens[r] for r in order], engine, outputs


GREEDY = SamplingParams(max_tokens=NEW_TOKENS)


def _config(**kwargs: Any) -> EngineConfig:
    base: dict[str, Any] = {"block_size": BLOCK_SIZE, "max_num_seqs": 8, "num_kv_blocks": 256}
    return EngineConfig(**(base | kwargs))

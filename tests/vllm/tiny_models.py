"""Tiny random checkpoints of architectures for the vLLM engine's tests: written with
transformers' own classes (`save_pretrained`), with the demo model's trained tokenizer. Heads
of 32 dimensions: the smallest vLLM's CPU attention runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.model.demo import BOS_TOKEN, EOS_TOKEN, load_corpus, train_tokenizer

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 512,
    # wide logits: greedy paths without near-ties, so engines that round differently agree
    "initializer_range": 0.2,
}


def write_model(out: Path, kind: str, seed: int = 0) -> Path:
    """A `kind` checkpoint ("llama", "gemma2", "mixtral") in `out`, fp32, random weights."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(load_corpus())
    ids = {
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        "eos_token_id": tokenizer.token_to_id(EOS_TOKEN),
        "pad_token_id": tokenizer.token_to_id(EOS_TOKEN),
    }
    if kind == "llama":
        config: Any = transformers.LlamaConfig(**_COMMON, **ids, tie_word_embeddings=False)
        model_cls: Any = transformers.LlamaForCausalLM
    elif kind == "gemma2":
        config = transformers.Gemma2Config(
            **_COMMON, **ids, sliding_window=64, query_pre_attn_scalar=32
        )
        model_cls = transformers.Gemma2ForCausalLM
    elif kind == "mixtral":
        config = transformers.MixtralConfig(
            **_COMMON, **ids, num_local_experts=4, num_experts_per_tok=2
        )
        model_cls = transformers.MixtralForCausalLM
    else:
        raise ValueError(f"unknown kind {kind!r}")
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS_TOKEN,
                "eos_token": EOS_TOKEN,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    return out

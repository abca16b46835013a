"""Differential test: our Llama/Mistral decoder against ``transformers`` on the same weights.

Same greedy tokens (through the whole Generator: prefill, KV cache, decode) and close logits at
every step, for GQA, MQA, a sliding window, tied embeddings and the demo checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers

from worker.engine.generate import Generator
from worker.engine.sampling import SamplingParams
from worker.model.config import ModelConfig
from worker.model.demo import create_demo_model
from worker.model.llama import LlamaModel
from worker.model.weights import build_model

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 128
NEW_TOKENS = 20
PROMPT_LENGTHS = (1, 7, 30)


def _hf_model(kind: str, tmp_path: Path) -> Any:
    """A small random HF model, saved to and reloaded from ``tmp_path``."""
    common: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
        # larger than the default 0.02, so the top two logits are never near-ties
        "initializer_range": 0.1,
        "bos_token_id": 0,
        "eos_token_id": None,  # no early stop: always NEW_TOKENS tokens to compare
        "pad_token_id": None,
    }
    if kind == "gqa":
        config = transformers.LlamaConfig(num_key_value_heads=2, **common)
        cls = transformers.LlamaForCausalLM
    elif kind == "mqa":
        config = transformers.LlamaConfig(num_key_value_heads=1, tie_word_embeddings=True, **common)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.MistralConfig(num_key_value_heads=2, sliding_window=8, **common)
        cls = transformers.MistralForCausalLM
    torch.manual_seed(1234)
    cls(config).save_pretrained(tmp_path)
    return cls.from_pretrained(tmp_path).eval()


def _our_model(checkpoint: Path) -> LlamaModel:
    config = ModelConfig.from_hf_dict(json.loads((checkpoint / "config.json").read_text()))
    return build_model(config, load_file(str(checkpoint / "model.safetensors")))


def _id_tokenizer() -> Tokenizer:
    """Token ``t{i}`` is id i: enough for the Generator to detokenize arbitrary ids."""
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB_SIZE)}, "t1"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def _hf_greedy(hf_model: Any, prompt_ids: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    input_ids = torch.tensor([prompt_ids])
    out = hf_model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0, len(prompt_ids) :].tolist(), [lg[0] for lg in out.logits]


def _our_greedy_logits(model: LlamaModel, prompt_ids: list[int]) -> list[torch.Tensor]:
    """Drive the model directly: prefill, then one token at a time through the KV cache."""
    cache = model.new_cache(batch_size=1, max_len=len(prompt_ids) + NEW_TOKENS)
    input_ids = torch.tensor([prompt_ids])
    positions = torch.arange(len(prompt_ids))[None]
    steps = []
    with torch.inference_mode():
        for _ in range(NEW_TOKENS):
            # logits: [1, vocab]
            logits = model(input_ids, positions, cache)
            steps.append(logits[0])
            input_ids = logits.argmax(-1, keepdim=True)
            positions = torch.tensor([[cache.num_tokens]])
    return steps


@pytest.mark.parametrize("kind", ["gqa", "mqa", "mistral_sliding_window"])
def test_greedy_tokens_and_logits_match(kind: str, tmp_path: Path) -> None:
    hf_model = _hf_model(kind, tmp_path)
    model = _our_model(tmp_path)
    generator = Generator(model, _id_tokenizer(), eos_token_ids=(), max_context=128)
    rng = torch.Generator().manual_seed(7)

    for length in PROMPT_LENGTHS:
        prompt_ids = [0, *torch.randint(2, VOCAB_SIZE, (length - 1,), generator=rng).tolist()]
        hf_tokens, hf_logits = _hf_greedy(hf_model, prompt_ids)

        steps = list(generator.generate_ids(prompt_ids, SamplingParams(max_tokens=NEW_TOKENS)))
        assert [s.token_id for s in steps] == hf_tokens, f"prompt length {length}"
        assert steps[-1].finish_reason == "length"

        our_logits = _our_greedy_logits(model, prompt_ids)
        for i, (ours, ref) in enumerate(zip(our_logits, hf_logits, strict=True)):
            torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0, msg=f"step {i}")


def test_demo_checkpoint_matches_transformers(tmp_path: Path) -> None:
    checkpoint = create_demo_model(tmp_path / "demo", seed=3, train_steps=0)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(checkpoint).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = _our_model(checkpoint)
    config = model.config
    generator = Generator(
        model, Tokenizer.from_file(str(checkpoint / "tokenizer.json")), config.eos_token_ids, 512
    )

    for prompt in ("The", "A serverless platform runs code", "Snow falls on the mountains."):
        prompt_ids = generator.encode(prompt)
        assert prompt_ids == hf_tokenizer(prompt).input_ids
        input_ids = torch.tensor([prompt_ids])
        hf_out = hf_model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=hf_tokenizer.eos_token_id,
        )
        hf_tokens = hf_out[0, len(prompt_ids) :].tolist()
        steps = list(generator.generate(prompt, SamplingParams(max_tokens=NEW_TOKENS)))
        assert [s.token_id for s in steps] == hf_tokens
        text = "".join(s.text_delta for s in steps)
        assert text == hf_tokenizer.decode(hf_tokens, skip_special_tokens=True)

        with torch.inference_mode():
            ref = hf_model(input_ids).logits[0, -1]
            ours = model(input_ids, torch.arange(len(prompt_ids))[None], model.new_cache(1, 64))
        torch.testing.assert_close(ours[0], ref, atol=1e-4, rtol=0)


def test_build_model_names_bad_tensors(tmp_path: Path) -> None:
    _hf_model("gqa", tmp_path)
    config = ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    weights = load_file(str(tmp_path / "model.safetensors"))

    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing tensors: model\.norm\.weight"):
        build_model(config, missing)
    extra = {**weights, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.9\.mlp\.up_proj"):
        build_model(config, extra)
    bad = {**weights, "lm_head.weight": torch.zeros(3, 64)}
    with pytest.raises(ValueError, match=r"mis-shaped tensors: lm_head\.weight \(3, 64\)"):
        build_model(config, bad)

    model = build_model(config, weights, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())

"""Whole checkpoints against ``transformers``: bfloat16 and float16 track its greedy tokens up to
a near-tie, and the demo checkpoint matches it end to end (tokenizer, tokens, text, and the
dense path's logits).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from tests.unit.hf_reference import (
    GREEDY,
    NEW_TOKENS,
    PROMPTS,
    _config,
    _hf_greedy,
    _our_model,
    _save_hf_model,
    run_engine,
    transformers,
)
from worker.engine.generate import Generator
from worker.engine.params import SamplingParams
from worker.model.demo import create_demo_model


def test_bfloat16_and_float16_track_transformers(tmp_path: Path) -> None:
    """Half precision: greedy tokens agree until transformers' own top two logits are within
    rounding of each other (a near-tie either side may break)."""
    hf_fp32 = _save_hf_model("llama_gqa", tmp_path)
    prompts = PROMPTS[1:3]
    for dtype, margin in ((torch.bfloat16, 0.1), (torch.float16, 0.02)):
        hf_model = hf_fp32.to(dtype)
        model = _our_model(tmp_path, dtype)
        assert model.lm_head.weight.dtype == dtype
        tokens, _, _ = run_engine(model, prompts, _config(), GREEDY)
        for prompt, ours in zip(prompts, tokens, strict=True):
            ref, logits = _hf_greedy(hf_model, prompt)
            top2 = logits.float().topk(2, dim=-1).values
            for j, (a, b) in enumerate(zip(ours, ref, strict=True)):
                if a != b:
                    gap = float(top2[j, 0] - top2[j, 1])
                    assert gap < margin, f"{dtype}: token {j} differs with a top-2 gap of {gap}"
                    break
        hf_fp32 = hf_model.float()


def test_demo_checkpoint_matches_transformers(tmp_path: Path) -> None:
    checkpoint = create_demo_model(tmp_path / "demo", seed=3, train_steps=0)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(checkpoint).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = _our_model(checkpoint)
    config = model.config
    generator = Generator(
        model, Tokenizer.from_file(str(checkpoint / "tokenizer.json")), config.eos_token_ids, 512
    )

    prompts = ("The", "A serverless platform runs code", "Snow falls on the mountains.")
    results = generator.run_batch(list(prompts), SamplingParams(max_tokens=NEW_TOKENS))
    for prompt, result in zip(prompts, results, strict=True):
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
        assert list(result.token_ids) == hf_tokens
        assert result.text == hf_tokenizer.decode(hf_tokens, skip_special_tokens=True)

        with torch.inference_mode():  # the dense (training) path too
            ref = hf_model(input_ids).logits[0]
            ours = model.forward_all(input_ids)[0]
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)

"""The random Llama every system loads (HF format, by size name), the GPU's name, and the
summary of one system's result (useful tokens/s, TTFT, ITL, peak RSS)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

SIZES: dict[str, dict[str, int]] = {
    # head_dim 64: vLLM's CPU attention has no kernel for smaller heads
    "quick": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "default": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8},
    # Llama-3.2-1B's shape (head_dim 64, GQA 4:1), a 32000 vocabulary
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
}


def make_checkpoint(path: Path, size_name: str) -> int:
    """A random Llama (HF format); returns its parameter count."""
    import torch
    import transformers

    size: dict[str, Any] = {
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 4096 if size_name == "quick" else 32000,
        **SIZES[size_name],
    }
    config = transformers.LlamaConfig(
        max_position_embeddings=4096,
        initializer_range=0.05,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
        **size,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def gpu_name() -> str:
    import torch

    return str(torch.cuda.get_device_name())


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def summarize(result: dict[str, Any], work: list[tuple[list[int], int]]) -> dict[str, float]:
    useful = sum(min(len(t), n) for t, (_, n) in zip(result["tokens"], work, strict=True))
    ttft = [ts[0] for ts in result["times"] if ts]
    itl = [b - a for ts in result["times"] for a, b in itertools.pairwise(ts)]
    return {
        "tok_s": useful / result["wall_s"],
        "wall_s": result["wall_s"],
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "itl_p50_ms": pct(itl, 50) * 1000,
        "itl_p99_ms": pct(itl, 99) * 1000,
        "peak_rss_mb": result["peak_rss_mb"],
    }

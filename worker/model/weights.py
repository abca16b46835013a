"""Build a ``LlamaModel`` from named tensors in Hugging Face naming.

The tensors come from the loader (already on their device); this module only checks names,
shapes and devices, casts, and places them. The model skeleton is built on the meta device, so
no memory is spent on a random init that would be thrown away.

Example:

    >>> weights = safetensors.torch.load_file("model.safetensors")
    >>> model = build_model(ModelConfig.from_hf_dict(config_json), weights)
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from worker.model.config import ModelConfig
from worker.model.llama import LlamaModel

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Tensors some checkpoints carry that the model recomputes (old Llama conversions saved them).
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
_TIED_HEAD = "lm_head.weight"


def build_model(
    config: ModelConfig, weights: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None
) -> LlamaModel:
    """Return an eval-mode, grad-free model holding ``weights`` cast to ``dtype``.

    ``dtype`` defaults to the checkpoint's ``torch_dtype``. Raises ValueError naming every
    missing, unexpected or mis-shaped tensor. With tied embeddings a stored ``lm_head.weight``
    is accepted and ignored.
    """
    dtype = dtype or _DTYPES[config.torch_dtype]
    with torch.device("meta"):
        model = LlamaModel(config)
    expected = model.state_dict()
    if config.tie_word_embeddings:
        expected.pop(_TIED_HEAD)

    names = {n for n in weights if not _IGNORED.fullmatch(n)}
    if config.tie_word_embeddings:
        names.discard(_TIED_HEAD)
    missing = sorted(expected.keys() - names)
    unexpected = sorted(names - expected.keys())
    misshaped = sorted(
        f"{n} {tuple(weights[n].shape)} != {tuple(expected[n].shape)}"
        for n in names & expected.keys()
        if weights[n].shape != expected[n].shape
    )
    problems = [
        f"{label}: {', '.join(items)}"
        for label, items in (
            ("missing tensors", missing),
            ("unexpected tensors", unexpected),
            ("mis-shaped tensors", misshaped),
        )
        if items
    ]
    if problems:
        raise ValueError("checkpoint does not match the config; " + "; ".join(problems))

    devices = {weights[n].device for n in expected}
    if len(devices) != 1:
        raise ValueError(f"tensors are on several devices: {sorted(map(str, devices))}")
    (device,) = devices

    state = {n: weights[n].to(dtype=dtype) for n in expected}
    model.load_state_dict(state, strict=not config.tie_word_embeddings, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # the RoPE buffer was computed on CPU; move it next to the weights
    model.inv_freq = model.inv_freq.to(device)
    model.eval()
    model.requires_grad_(False)
    return model

"""Build a ``LlamaModel`` from named tensors in Hugging Face naming (and back).

The tensors come from the loader (already on their device); this module only checks names,
shapes and devices, casts, fuses (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``) and
places them. A loader may also hand over already fused ``qkv_proj`` / ``gate_up_proj``
tensors: ``load_name_map(config)`` has the loader stream q/k/v and gate/up into them directly.
The model skeleton is built on the meta device, so no memory is spent on a random init that
would be thrown away.

Example:

    >>> weights = safetensors.torch.load_file("model.safetensors")
    >>> model = build_model(ModelConfig.from_hf_dict(config_json), weights)
    >>> save_file(hf_state_dict(model), "copy.safetensors")  # HF names again
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn

from common.model_config import ModelConfig
from loader.options import Fused
from worker.model.llama import LlamaModel

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Tensors some checkpoints carry that the model recomputes (old Llama conversions saved them).
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
_TIED_HEAD = "lm_head.weight"
# fused module -> the HF modules stacked (in this order) along the output dimension
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def torch_dtype(config: ModelConfig) -> torch.dtype:
    """The checkpoint's dtype as a torch dtype."""
    return _DTYPES[config.torch_dtype]


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a HF checkpoint of ``config`` holds (tied head omitted)."""
    c = config
    hidden, inter, head_dim = c.hidden_size, c.intermediate_size, c.head_dim
    q_out, kv_out = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not c.tie_word_embeddings:
        shapes[_TIED_HEAD] = (c.vocab_size, hidden)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        layer = {
            "self_attn.q_proj.weight": (q_out, hidden),
            "self_attn.k_proj.weight": (kv_out, hidden),
            "self_attn.v_proj.weight": (kv_out, hidden),
            "self_attn.o_proj.weight": (hidden, q_out),
            "mlp.gate_proj.weight": (inter, hidden),
            "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter),
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
        }
        if c.qkv_bias:
            layer |= {
                "self_attn.q_proj.bias": (q_out,),
                "self_attn.k_proj.bias": (kv_out,),
                "self_attn.v_proj.bias": (kv_out,),
            }
        if c.o_proj_bias:
            layer["self_attn.o_proj.bias"] = (hidden,)
        if c.qk_norm:
            layer |= {
                "self_attn.q_norm.weight": (head_dim,),
                "self_attn.k_norm.weight": (head_dim,),
            }
        shapes |= {p + name: shape for name, shape in layer.items()}
    return shapes


@contextlib.contextmanager
def _skip_init() -> Iterator[None]:
    """No random init while building the skeleton: it is thrown away, and on the meta device
    torch's first ``normal_`` imports its compiler stack (seconds of cold start)."""
    saved = {cls: cls.reset_parameters for cls in (nn.Linear, nn.Embedding)}
    try:
        for cls in saved:
            cls.reset_parameters = lambda self: None  # type: ignore[method-assign]
        yield
    finally:
        for cls, method in saved.items():
            cls.reset_parameters = method  # type: ignore[method-assign]


def load_name_map(config: ModelConfig) -> Callable[[str], str | Fused | None]:
    """The loader's name map for ``config``: q/k/v and gate/up land side by side in their fused
    tensor (no concatenation copy after the load: on CPU that copy was most of the model
    build, on a GPU it doubled those weights' memory for a moment); tensors the model
    recomputes or ties are not fetched at all."""
    members = {
        part: (fused, index) for fused, parts in _FUSED.items() for index, part in enumerate(parts)
    }

    def name_map(name: str) -> str | Fused | None:
        if _IGNORED.fullmatch(name) or (config.tie_word_embeddings and name == _TIED_HEAD):
            return None
        for part, (fused, index) in members.items():
            marker = f".{part}."
            if marker in name:
                prefix, suffix = name.split(marker)
                return Fused(f"{prefix}.{fused}.{suffix}", index)
        return name

    return name_map


def _fused_sources(name: str) -> tuple[str, ...] | None:
    """HF names stacked into the fused parameter ``name`` (None if ``name`` is not fused)."""
    for fused, parts in _FUSED.items():
        marker = f".{fused}."
        if marker in name:
            prefix, suffix = name.split(marker)
            return tuple(f"{prefix}.{part}.{suffix}" for part in parts)
    return None


def build_model(
    config: ModelConfig, weights: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None
) -> LlamaModel:
    """Return an eval-mode, grad-free model holding ``weights`` cast to ``dtype``.

    ``dtype`` defaults to the checkpoint's ``torch_dtype``. Raises ValueError naming every
    missing, unexpected or mis-shaped tensor (in HF names). With tied embeddings a stored
    ``lm_head.weight`` is accepted and ignored.
    """
    dtype = dtype or torch_dtype(config)
    with torch.device("meta"), _skip_init():
        model = LlamaModel(config)
    params = model.state_dict()
    if config.tie_word_embeddings:
        params.pop(_TIED_HEAD)

    expected = hf_tensor_shapes(config)
    names = {n for n in weights if not _IGNORED.fullmatch(n)}
    if config.tie_word_embeddings:
        names.discard(_TIED_HEAD)
    # a pre-fused tensor stands for its parts
    for name in names & params.keys():
        parts = _fused_sources(name)
        if parts is not None:
            for part in parts:
                expected.pop(part, None)
            expected[name] = tuple(params[name].shape)

    missing = sorted(expected.keys() - names)
    unexpected = sorted(names - expected.keys())
    misshaped = sorted(
        f"{n} {tuple(weights[n].shape)} != {expected[n]}"
        for n in names & expected.keys()
        if tuple(weights[n].shape) != expected[n]
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

    state: dict[str, torch.Tensor] = {}
    for name in params:
        parts = _fused_sources(name)
        if parts is None or name in weights:
            state[name] = weights[name].to(dtype=dtype)
        else:
            state[name] = torch.cat([weights[p].to(dtype=dtype) for p in parts], dim=0)
    model.load_state_dict(state, strict=not config.tie_word_embeddings, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # the RoPE buffer was computed on CPU; move it next to the weights
    model.inv_freq = model.inv_freq.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def hf_state_dict(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The model's tensors under HF names (fused projections split), ready to save."""
    shapes = hf_tensor_shapes(model.config)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == _TIED_HEAD and model.config.tie_word_embeddings:
            continue
        parts = _fused_sources(name)
        if parts is None:
            out[name] = tensor.detach().contiguous()
            continue
        sizes = [shapes[p][0] for p in parts]
        for part, chunk in zip(parts, tensor.detach().split(sizes, dim=0), strict=True):
            out[part] = chunk.contiguous()
    return out

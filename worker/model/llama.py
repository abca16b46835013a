"""Llama-family decoder in plain torch (the CPU reference path).

Module names match the Hugging Face checkpoint names (``model.layers.0.self_attn.q_proj`` ...),
so ``state_dict()`` keys are the safetensors tensor names and loading needs no renaming table.
The arithmetic follows ``transformers``' ``LlamaForCausalLM`` step by step (float32 RoPE
tables, float32 RMSNorm statistics) so greedy tokens match it.

Example:

    >>> model = build_model(config, weights)  # worker.model.weights
    >>> cache = model.new_cache(batch_size=1, max_len=64)
    >>> ids = torch.tensor([[1, 15, 27]])
    >>> logits = model(ids, torch.arange(3)[None], cache)  # [1, vocab]; cache holds 3 tokens
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from worker.model.config import ModelConfig, RopeScaling


class KVCache:
    """Contiguous key/value cache of one batch of requests, preallocated to ``max_len`` tokens.

    NOTE: slots are filled left to right and never rewritten; every row of the batch holds the
    same number of tokens (``num_tokens``). Paged attention replaces this in a later issue.
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        # k, v: [num_layers, batch, num_kv_heads, max_len, head_dim]
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.num_tokens = 0

    def append(
        self, layer_idx: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys/values after the cached ones; return all of them for this layer."""
        # k, v: [batch, num_kv_heads, seq, head_dim]
        start, end = self.num_tokens, self.num_tokens + k.shape[2]
        self.k[layer_idx, :, :, start:end] = k
        self.v[layer_idx, :, :, start:end] = v
        # returned: [batch, num_kv_heads, end, head_dim] (views, no copy)
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, num_new_tokens: int) -> None:
        """Mark the tokens written by the last forward as cached (after all layers ran)."""
        self.num_tokens += num_new_tokens


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse RoPE frequencies, float32 on CPU, as ``transformers`` computes them."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    # inv_freq: [head_dim // 2]
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between
    # interpolated smoothly.
    old_context_len = s.original_max_position_embeddings
    low_freq_wavelen = old_context_len / s.low_freq_factor
    high_freq_wavelen = old_context_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context_len / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden]; statistics in float32 whatever the model dtype
        input_dtype = x.dtype
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        return self.weight * x32.to(input_dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.sliding_window = config.sliding_window
        bias = config.attention_bias
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_out, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_out, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_out, bias=bias)
        self.o_proj = nn.Linear(q_out, config.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        # x: [batch, seq, hidden]; cos, sin: [batch, 1, seq, head_dim]
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        # q: [batch, num_heads, seq, head_dim]; k, v: [batch, num_kv_heads, seq, head_dim]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin

        num_cached = 0
        if cache is not None:
            num_cached = cache.num_tokens
            k, v = cache.append(self.layer_idx, k, v)
        # k, v: [batch, num_kv_heads, num_cached + seq, head_dim]
        mask = self._mask(seq, num_cached, x.device)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and seq > 1,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        # out: [batch, num_heads, seq, head_dim] -> [batch, seq, num_heads * head_dim]
        out = out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)
        # proj: [batch, seq, hidden]
        proj: torch.Tensor = self.o_proj(out)
        return proj

    def _mask(self, seq: int, num_cached: int, device: torch.device) -> torch.Tensor | None:
        """Boolean attention mask (True = attend), or None when ``is_causal`` says it all."""
        num_keys = num_cached + seq
        window = self.sliding_window
        within_window = window is None or num_keys <= window
        if within_window and (seq == 1 or num_cached == 0):
            return None  # one query sees every key; or plain causal from slot 0
        # q_slot: [seq, 1]; k_slot: [1, num_keys]
        q_slot = torch.arange(num_cached, num_keys, device=device)[:, None]
        k_slot = torch.arange(num_keys, device=device)[None, :]
        mask = k_slot <= q_slot
        if window is not None:
            mask &= q_slot - k_slot < window
        # mask: [seq, num_keys]
        return mask


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch, seq, hidden] -> SwiGLU [batch, seq, intermediate] -> [batch, seq, hidden]
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None
    ) -> torch.Tensor:
        # x: [batch, seq, hidden] (pre-norm residual blocks)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class DecoderStack(nn.Module):
    """The ``model.`` prefix of HF names: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    """Llama / Mistral causal LM: token ids in, next-token logits out.

    Example:

        >>> model = LlamaModel(config)  # random init; see build_model for checkpoints
        >>> cache = model.new_cache(batch_size=1, max_len=32)
        >>> logits = model(torch.tensor([[1, 2, 3]]), torch.arange(3)[None], cache)
        >>> next_id = int(logits[0].argmax())
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # NOTE: computed on CPU even when the module is built on the meta device; not saved.
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.inv_freq: torch.Tensor

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty KV cache for ``batch_size`` rows of up to ``max_len`` tokens each."""
        c = self.config
        weight = self.model.embed_tokens.weight
        return KVCache(
            c.num_hidden_layers,
            batch_size,
            c.num_key_value_heads,
            max_len,
            c.head_dim,
            weight.dtype,
            weight.device,
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Run new tokens after those in ``cache``; return the logits of each row's last one.

        input_ids, positions: [batch, seq]. The new keys/values are appended to ``cache``.
        Returns float32 logits [batch, vocab].
        """
        if input_ids.shape != positions.shape or input_ids.dim() != 2:
            raise ValueError(
                f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} "
                "must both be [batch, seq]"
            )
        seq = input_ids.shape[1]
        if cache.num_tokens + seq > cache.max_len:
            raise ValueError(
                f"KV cache overflow: {cache.num_tokens} cached + {seq} new > {cache.max_len}"
            )
        hidden = self._hidden(input_ids, positions, cache)
        cache.advance(seq)
        # hidden[:, -1]: [batch, hidden] -> logits: [batch, vocab]
        logits: torch.Tensor = self.lm_head(hidden[:, -1])
        return logits.float()

    def forward_all(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Training / scoring path: causal attention over whole rows, no cache.

        input_ids: [batch, seq]. Returns logits for every position: [batch, seq, vocab].
        """
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        logits: torch.Tensor = self.lm_head(self._hidden(input_ids, positions, None))
        return logits

    def _hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None
    ) -> torch.Tensor:
        # x: [batch, seq, hidden]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache)
        out: torch.Tensor = self.model.norm(x)
        return out

    def _rope(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 tables whatever the model dtype, like transformers
        inv_freq = self.inv_freq.to(positions.device)
        # freqs: [batch, seq, head_dim // 2]
        freqs = positions.float()[..., None] * inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        # cos, sin: [batch, 1, seq, head_dim] (broadcast over heads)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

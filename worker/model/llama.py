"""Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) over a paged KV cache.

A step's tokens arrive flattened ([num_tokens]) whatever sequences they belong to; attention
(``worker.model.attention``) sorts out who sees what through the step's metadata. The
arithmetic follows ``transformers`` step by step (float32 RoPE tables, float32 RMSNorm
statistics, the same op order) so greedy tokens match it.

Module names follow the Hugging Face checkpoint names (``model.layers.0.self_attn...``) except
for two fused projections: ``qkv_proj`` (q, k, v stacked on the output dim) and
``gate_up_proj`` (gate, up); ``worker.model.weights`` maps HF tensors in and out.

Example:

    >>> model = build_model(config, weights)  # worker.model.weights
    >>> hidden = model(input_ids, positions, kv_caches, meta)  # [num_tokens, hidden]
    >>> logits = model.compute_logits(hidden[last_token_indices])  # [num_seqs, vocab] float32
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig, RopeScaling
from worker.model.attention import AttentionMetadata, KVCacheLayer, paged_attention

if TYPE_CHECKING:
    from worker.model.native_ops import RowOps


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


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (transformers' maths, op for op) in three buffers
    instead of six (inference only: it writes into its own intermediates).

    x: [num_tokens, heads, D]; cos, sin: [num_tokens, 1, D]. Returns a new contiguous tensor.
    """
    half = x.shape[-1] // 2
    out = x * cos
    # rotated: [-x2, x1]
    rotated = torch.empty_like(out)
    torch.neg(x[..., half:], out=rotated[..., :half])
    rotated[..., half:] = x[..., :half]
    rotated.mul_(sin)
    return out.add_(rotated)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        # CPU inference: the C kernel (worker.model.native_ops.attach), else torch
        self.native: RowOps | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden]; statistics in float32 whatever the model dtype
        if self.native is not None and self.native.takes(x):
            return self.native.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:
            # one fused kernel, the same products and sum as the formula below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        input_dtype = x.dtype
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        return self.weight * x32.to(input_dtype)

    def add_forward(
        self, branch: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual sum and its norm: ``(forward(branch + residual), branch + residual)``.
        Inference only: the sum is written into one of the two (both are the step's own)."""
        native = self.native
        if native is not None and native.takes(branch) and native.takes(residual):
            # one pass: the sum into residual, its norm out (the C kernel)
            return native.add_rms_norm_(branch, residual, self.weight, self.eps), residual
        total = branch.add_(residual)
        return self(total), total


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.sliding_window = config.layer_sliding_window(layer_idx)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        # CPU inference: the C rotary embedding (worker.model.native_ops.attach), else torch
        self.native: RowOps | None = None

    def _qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project, normalise (Qwen3) and rotate. x: [*lead, hidden]; cos, sin: [*lead, D].

        Returns q: [*lead, Hq, D]; k, v: [*lead, Hkv, D].
        """
        lead = x.shape[:-1]
        # qkv: [*lead, (Hq + 2 Hkv) * D]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(*lead, self.num_heads, self.head_dim)
        k = k.view(*lead, self.num_kv_heads, self.head_dim)
        v = v.view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # cos, sin broadcast over heads: [*lead, 1, D]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCacheLayer,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # x: [num_tokens, hidden]; cos, sin: [num_tokens, D]
        if self.q_norm is None:
            q, k, v = self._qkv_rope_once(x, cos, sin)
        else:
            q, k, v = self._qkv(x, cos, sin)
        # out: [num_tokens, Hq, D]
        out = paged_attention(q, k, v, kv_cache, meta, self.scale, self.sliding_window)
        proj: torch.Tensor = self.o_proj(out.reshape(x.shape[0], self.q_size))
        return proj

    def _qkv_rope_once(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_qkv`` for the paged path without q/k norms: q and k rotated in one pass.

        x: [num_tokens, hidden]; cos, sin: [num_tokens, D]. Returns q: [num_tokens, Hq, D];
        k, v: [num_tokens, Hkv, D] (views).
        """
        num_tokens = x.shape[0]
        # qkv: [num_tokens, (Hq + 2 Hkv) * D]
        qkv = self.qkv_proj(x)
        heads = self.num_heads + self.num_kv_heads
        native = self.native
        in_place = native is not None and all(native.takes(t) for t in (qkv, cos, sin))
        if native is not None and in_place:
            # rotated in place: qkv is this step's own buffer
            native.rope_(qkv, heads, cos, sin)
        # qk: [num_tokens, Hq + Hkv, D], rotated
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, heads, self.head_dim)
        if not in_place:
            qk = _apply_rope(qk, cos.unsqueeze(-2), sin.unsqueeze(-2))
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        return qk[:, : self.num_heads], qk[:, self.num_heads :], v

    def forward_dense(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Training / scoring: whole rows, causal, no cache. x: [batch, seq, hidden]."""
        batch, seq, _ = x.shape
        q, k, v = self._qkv(x, cos, sin)
        mask = None
        if self.sliding_window is not None and seq > self.sliding_window:
            pos = torch.arange(seq, device=x.device)
            diff = pos[:, None] - pos[None, :]
            # mask: [seq, seq]
            mask = (diff >= 0) & (diff < self.sliding_window)
        # SDPA layout [batch, heads, seq, D]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        # out: [batch, Hq, seq, D] -> [batch, seq, Hq * D]
        proj: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.q_size))
        return proj


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        # CPU inference: the C SwiGLU (worker.model.native_ops.attach), else torch
        self.native: RowOps | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden] -> gate, up: [..., intermediate] -> SwiGLU -> [..., hidden]
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out

    def forward_inference(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` with one intermediate fewer (no autograd: it writes into it)."""
        gate_up = self.gate_up_proj(x)
        native = self.native
        if native is not None and gate_up.dim() == 2 and native.takes(gate_up):
            # one pass (the C kernel) instead of silu, then a multiply, over strided halves
            out: torch.Tensor = self.down_proj(native.silu_mul(gate_up, self.intermediate_size))
            return out
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        out = self.down_proj(F.silu(gate).mul_(up))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Training / scoring: whole rows, no cache. x: [batch, seq, hidden]; pre-norm
        residuals."""
        x = x + self.self_attn.forward_dense(self.input_layernorm(x), cos, sin)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out

    def step(
        self,
        branch: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCacheLayer,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The paged path, the residual stream kept apart: the layer's input is ``branch +
        residual`` (``branch`` alone for the first layer), its output the pair it returns (the
        next norm adds them as it normalises). branch + residual is residual + branch bit for
        bit, so this is ``forward`` to the last bit."""
        # branch, residual: [num_tokens, hidden]
        if residual is None:
            residual, h = branch, self.input_layernorm(branch)
        else:
            h, residual = self.input_layernorm.add_forward(branch, residual)
        attended = self.self_attn(h, cos, sin, kv_cache, meta)
        h, residual = self.post_attention_layernorm.add_forward(attended, residual)
        return self.mlp.forward_inference(h), residual


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
    """Llama-family causal LM: a step's token ids in, hidden states out; logits on demand.

    Example:

        >>> model = LlamaModel(config)  # random init; see build_model for checkpoints
        >>> logits = model.forward_all(torch.tensor([[1, 2, 3]]))  # [1, 3, vocab]
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

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCacheLayer],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Run one step. input_ids, positions: [num_tokens]. Returns [num_tokens, hidden].

        The step's keys/values are written into ``kv_caches`` (one per layer) on the way.
        """
        # x: [num_tokens, hidden]; cos, sin: [num_tokens, D]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        residual: torch.Tensor | None = None
        layers = cast(list[DecoderLayer], self.model.layers)
        for layer, kv_cache in zip(layers, kv_caches, strict=True):
            x, residual = layer.step(x, residual, cos, sin, kv_cache, meta)
        if residual is None:
            out: torch.Tensor = self.model.norm(x)
            return out
        return self.model.norm.add_forward(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden] -> float32 logits [n, vocab] (lm_head in the model's dtype)."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()

    def forward_all(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Training / scoring path: causal attention over whole rows, no cache.

        input_ids: [batch, seq]. Returns logits for every position: [batch, seq, vocab].
        """
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        # x: [batch, seq, hidden]; cos, sin: [batch, seq, D]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        logits: torch.Tensor = self.lm_head(self.model.norm(x))
        return logits

    def _rope(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 tables whatever the model dtype, like transformers
        inv_freq = self.inv_freq.to(positions.device)
        # freqs: [*positions.shape, head_dim // 2]
        freqs = positions.float()[..., None] * inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        # cos, sin: [*positions.shape, head_dim]
        return emb.cos().to(dtype), emb.sin().to(dtype)

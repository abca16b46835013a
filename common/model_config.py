"""Model configuration parsed from a Hugging Face ``config.json``.

Only what the Llama-family decoder needs is kept, already validated, so the model code never
looks at the raw dict. Unsupported architectures and options fail here, with the field named,
rather than producing wrong tokens later.

Example:

    >>> cfg = ModelConfig.from_hf_dict(json.loads(Path("config.json").read_text()))
    >>> cfg.num_key_value_heads, cfg.head_dim
    (8, 128)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
SUPPORTED_DTYPES = frozenset({"float32", "float16", "bfloat16"})
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3"})


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling (HF ``rope_scaling`` / ``rope_parameters``); ``default`` never
    appears here: no scaling is ``ModelConfig.rope_scaling is None``."""

    # "linear" (position interpolation) or "llama3" (Llama 3.1 frequency-band scaling)
    rope_type: str
    # divisor applied to the (low-)frequencies
    factor: float
    # llama3 only: wavelength band boundaries, as fractions of the original context
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # llama3 only: the context length the model was pre-trained with
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Validated architecture of a Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3).

    The families differ only in a few switches: biases on the projections (Qwen2: q/k/v),
    RMSNorm of each query/key head (Qwen3), sliding-window attention (Mistral; Qwen when
    ``use_sliding_window``) and RoPE scaling (Llama 3.1: "llama3").
    """

    # "llama", "mistral", "qwen2" or "qwen3"
    model_type: str
    # number of rows of the embedding table and of the lm_head
    vocab_size: int
    # width of the residual stream
    hidden_size: int
    # width of the SwiGLU hidden layer
    intermediate_size: int
    # number of decoder layers
    num_hidden_layers: int
    # number of query heads
    num_attention_heads: int
    # number of key/value heads (== num_attention_heads: MHA, 1: MQA, else GQA)
    num_key_value_heads: int
    # width of one attention head (not always hidden_size // num_attention_heads)
    head_dim: int
    # epsilon of every RMSNorm
    rms_norm_eps: float
    # RoPE base
    rope_theta: float
    # longest sequence (prompt + generated) the positions support
    max_position_embeddings: int
    # lm_head shares the embedding matrix
    tie_word_embeddings: bool
    # dtype the checkpoint was saved in: "float32" | "float16" | "bfloat16"
    torch_dtype: str
    # beginning-of-sequence token, None if the model has none
    bos_token_id: int | None
    # tokens that end generation (may be empty)
    eos_token_ids: tuple[int, ...]
    # RoPE scaling, None for plain RoPE
    rope_scaling: RopeScaling | None = None
    # q/k/v projections carry a bias (Qwen2: always; Llama, Qwen3: attention_bias)
    qkv_bias: bool = False
    # o_proj carries a bias (Llama, Qwen3: attention_bias; Qwen2: never)
    o_proj_bias: bool = False
    # RMSNorm over head_dim on each query and key head before RoPE (Qwen3)
    qk_norm: bool = False
    # sliding-window attention: a query sees at most this many keys (itself included) in the
    # layers listed in sliding_window_layers
    sliding_window: int | None = None
    # indices of the layers with sliding-window attention (all of them for Mistral)
    sliding_window_layers: frozenset[int] = frozenset()

    def layer_sliding_window(self, layer_idx: int) -> int | None:
        """The window of one layer, None for full causal attention."""
        return self.sliding_window if layer_idx in self.sliding_window_layers else None

    @property
    def num_kv_groups(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Parse a HF ``config.json`` dict; raise ValueError naming the offending field."""
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type: {model_type!r} is not supported "
                f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
            )
        hidden_act = d.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"hidden_act: {hidden_act!r} is not supported (supported: 'silu')")
        if d.get("mlp_bias"):
            raise ValueError("mlp_bias: true is not supported")
        quantization = d.get("quantization_config")
        if quantization:
            # Refused here, where the deploy-time check and the worker both parse the config:
            # the quantized tensors (scales, packed weights) are not found to be missing only
            # after the weights were fetched.
            method = quantization.get("quant_method") if isinstance(quantization, dict) else None
            raise ValueError(
                f"quantization_config: {method or 'quantized'} checkpoints are not supported "
                "(the engine runs float32, float16 and bfloat16 weights)"
            )

        vocab_size = _positive_int(d, "vocab_size")
        hidden_size = _positive_int(d, "hidden_size")
        intermediate_size = _positive_int(d, "intermediate_size")
        num_hidden_layers = _positive_int(d, "num_hidden_layers")
        num_attention_heads = _positive_int(d, "num_attention_heads")
        max_position_embeddings = _positive_int(d, "max_position_embeddings")
        num_key_value_heads = _positive_int(d, "num_key_value_heads", default=num_attention_heads)
        if num_attention_heads % num_key_value_heads != 0:
            raise ValueError(
                f"num_key_value_heads: {num_key_value_heads} must divide "
                f"num_attention_heads ({num_attention_heads})"
            )
        if d.get("head_dim") is None and hidden_size % num_attention_heads != 0:
            raise ValueError(
                f"head_dim: missing, and hidden_size ({hidden_size}) is not a multiple of "
                f"num_attention_heads ({num_attention_heads})"
            )
        head_dim = _positive_int(d, "head_dim", default=hidden_size // num_attention_heads)
        if head_dim % 2 != 0:
            raise ValueError(f"head_dim: {head_dim} must be even (RoPE rotates pairs)")

        rms_norm_eps = _positive_float(d, "rms_norm_eps", default=1e-6)
        rope_params = d.get("rope_parameters") or {}
        if not isinstance(rope_params, dict):
            raise ValueError(f"rope_parameters: expected an object, got {rope_params!r}")
        rope_theta = _positive_float(
            {"rope_theta": d.get("rope_theta", rope_params.get("rope_theta"))},
            "rope_theta",
            default=10000.0,
        )
        # transformers 5 writes "rope_parameters" (with rope_theta inside); 4.x "rope_scaling".
        rope_scaling = _parse_rope_scaling(d.get("rope_scaling") or rope_params)

        torch_dtype = d.get("torch_dtype", d.get("dtype")) or "float32"
        if torch_dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"torch_dtype: {torch_dtype!r} is not supported "
                f"(supported: {', '.join(sorted(SUPPORTED_DTYPES))})"
            )

        bos_token_id = d.get("bos_token_id")
        if bos_token_id is not None and not _is_token_id(bos_token_id, vocab_size):
            raise ValueError(f"bos_token_id: {bos_token_id!r} is not a token id < {vocab_size}")
        eos = d.get("eos_token_id")
        eos_list = [] if eos is None else [eos] if not isinstance(eos, list) else eos
        if not all(_is_token_id(t, vocab_size) for t in eos_list):
            raise ValueError(f"eos_token_id: {eos!r} is not a token id (or list) < {vocab_size}")

        sliding_window, sliding_layers = _parse_sliding_window(
            d, model_type, num_hidden_layers, max_position_embeddings
        )
        attention_bias = _bool(d, "attention_bias", default=False)
        is_qwen2 = model_type == "qwen2"

        return cls(
            model_type=model_type,
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            head_dim=head_dim,
            rms_norm_eps=rms_norm_eps,
            rope_theta=rope_theta,
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=_bool(d, "tie_word_embeddings", default=False),
            torch_dtype=torch_dtype,
            bos_token_id=bos_token_id,
            eos_token_ids=tuple(eos_list),
            rope_scaling=rope_scaling,
            qkv_bias=is_qwen2 or attention_bias,
            o_proj_bias=attention_bias and not is_qwen2,
            qk_norm=model_type == "qwen3",
            sliding_window=sliding_window,
            sliding_window_layers=sliding_layers,
        )


def _parse_sliding_window(
    d: dict[str, Any], model_type: str, num_layers: int, max_position_embeddings: int
) -> tuple[int | None, frozenset[int]]:
    """(window, layers using it). Mistral: every layer; Qwen: only with use_sliding_window,
    in the layers ``layer_types`` marks "sliding_attention" (by default those from
    ``max_window_layers`` on, as transformers derives them)."""
    if d.get("sliding_window") is None:
        return None, frozenset()
    window = _positive_int(d, "sliding_window")
    if window >= max_position_embeddings:
        return None, frozenset()  # never reached: plain causal attention
    if model_type in ("llama", "mistral"):
        return window, frozenset(range(num_layers))
    if not _bool(d, "use_sliding_window", default=False):
        return None, frozenset()
    layer_types = d.get("layer_types")
    if layer_types is None:
        first = d.get("max_window_layers", num_layers)
        layer_types = [
            "sliding_attention" if i >= first else "full_attention" for i in range(num_layers)
        ]
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ValueError(
            f"layer_types: expected a list of {num_layers} strings, got {layer_types!r}"
        )
    unknown = set(layer_types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ValueError(f"layer_types: unsupported attention types {sorted(unknown)}")
    layers = frozenset(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    return (window, layers) if layers else (None, frozenset())


def _parse_rope_scaling(raw: Any) -> RopeScaling | None:
    if not isinstance(raw, dict):
        raise ValueError(f"rope_scaling: expected an object, got {raw!r}")
    rope_type = raw.get("rope_type", raw.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling: rope_type {rope_type!r} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED_ROPE_TYPES))})"
        )
    if rope_type == "default":
        return None
    factor = _positive_float(raw, "factor", prefix="rope_scaling.")
    if rope_type == "linear":
        return RopeScaling(rope_type=rope_type, factor=factor)
    return RopeScaling(
        rope_type=rope_type,
        factor=factor,
        low_freq_factor=_positive_float(raw, "low_freq_factor", prefix="rope_scaling."),
        high_freq_factor=_positive_float(raw, "high_freq_factor", prefix="rope_scaling."),
        original_max_position_embeddings=_positive_int(
            raw, "original_max_position_embeddings", prefix="rope_scaling."
        ),
    )


_MISSING = object()


def _positive_int(d: dict[str, Any], name: str, default: Any = _MISSING, prefix: str = "") -> int:
    value = d.get(name)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"{prefix}{name}: missing from config.json")
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{prefix}{name}: expected an integer >= 1, got {value!r}")
    return value


def _positive_float(
    d: dict[str, Any], name: str, default: Any = _MISSING, prefix: str = ""
) -> float:
    value = d.get(name)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"{prefix}{name}: missing from config.json")
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{prefix}{name}: expected a number > 0, got {value!r}")
    return float(value)


def _bool(d: dict[str, Any], name: str, default: bool) -> bool:
    value = d.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    return value


def _is_token_id(value: Any, vocab_size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size

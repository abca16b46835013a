"""Which engine serves a deployment (pure): the one it names, or for `auto` the built-in engine
where it can and vLLM otherwise. What the allowed engines cannot serve is refused, each reason
given, before anything is written (the API answers 422).

    builtin   this project's engine (worker/engine): the families the built-in engine's own
              parser (`common.model_config.ModelConfig.from_hf_dict`) accepts, unquantized,
              on one accelerator
    vllm      vLLM, in an environment of its own: the architectures and quantization methods
              of `vllm_support` (generated from vLLM's registry), on 1-8 accelerators (tensor
              parallelism), on a platform that has a vLLM environment

Inputs are facts: what the deploy-time check read of the checkpoint's config.json
(`Checkpoint`; an hf:// model is not read), the spec's `accelerator_count`, and the platform
(`Platform`: whether it has vLLM). Errors: one class, `EngineRefused(ValueError)`, holding a
`Refusal` (field, message) per engine it considered.

>>> mixtral = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}
>>> choose("auto", Checkpoint.from_config(mixtral), 1, Platform(has_vllm=True)).engine
'vllm'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.model_config import ModelConfig
from control_plane.domain import vllm_support

AUTO, BUILTIN, VLLM = "auto", "builtin", "vllm"
REQUESTS = (AUTO, BUILTIN, VLLM)  # what a spec may name; it resolves to BUILTIN or VLLM


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the deploy-time check read of a checkpoint's config.json."""

    model_type: str | None = None  # config.json `model_type`
    architectures: tuple[str, ...] = ()  # config.json `architectures` (vLLM's registry keys)
    quant_method: str | None = None  # quantization_config.quant_method; None: not quantized
    # why the built-in engine's parser refuses the config (it names the field); None: accepted
    builtin_refusal: str | None = None
    # why config.json was not read at deploy (an hf:// model, validation off); None: it was
    not_read: str | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Checkpoint:
        """The facts of a parsed config.json; the built-in engine's verdict is its parser's."""
        refusal = None
        try:
            ModelConfig.from_hf_dict(dict(config))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # ValueError names the field; the others are shapes the parser did not foresee.
            refusal = f"config.json: {exc}"
        archs = config.get("architectures")
        model_type = config.get("model_type")
        return cls(
            model_type=model_type if isinstance(model_type, str) else None,
            architectures=tuple(a for a in archs if isinstance(a, str))
            if isinstance(archs, list)
            else (),
            quant_method=_quant_method(config.get("quantization_config")),
            builtin_refusal=refusal,
        )

    @classmethod
    def unread(cls, why: str) -> Checkpoint:
        return cls(not_read=why)


@dataclass(frozen=True, slots=True)
class Platform:
    """What this platform offers."""

    # a vLLM environment: PLATFORM_VLLM_PYTHON (local workers) or the vLLM worker image
    has_vllm: bool
    vllm_version: str = vllm_support.VLLM_VERSION
    vllm_architectures: frozenset[str] = vllm_support.ARCHITECTURES
    vllm_quant_methods: frozenset[str] = vllm_support.QUANT_METHODS


@dataclass(frozen=True, slots=True)
class Choice:
    engine: str  # builtin | vllm
    reason: str  # why, for people (`engine_reason` of GET /v1/deployments/{name})


@dataclass(frozen=True, slots=True)
class Refusal:
    field: str  # the spec field to change: model | engine | accelerator_count
    message: str  # why this engine cannot serve it


class EngineRefused(ValueError):
    """No engine the spec allows can serve it: `refusals` has one reason per engine tried."""

    def __init__(self, summary: str, refusals: Sequence[Refusal]) -> None:
        super().__init__(summary)
        self.summary = summary
        self.refusals = tuple(refusals)


def choose(
    requested: str, checkpoint: Checkpoint, accelerator_count: int, platform: Platform
) -> Choice:
    """The engine of a deployment asking for `requested` (auto | builtin | vllm); raises
    EngineRefused when the engines it allows cannot serve it."""
    if requested not in REQUESTS:
        raise ValueError(f"engine {requested!r}: expected one of {', '.join(REQUESTS)}")
    unread = f"; {checkpoint.not_read}" if checkpoint.not_read else ""
    builtin = builtin_refusal(checkpoint, accelerator_count)
    if requested == BUILTIN:
        if builtin is not None:
            raise EngineRefused(f"engine builtin cannot serve it: {builtin.message}", [builtin])
        return Choice(BUILTIN, f"engine builtin, as requested{unread}")
    if requested == VLLM:
        vllm = vllm_refusal(checkpoint, platform)
        if vllm is not None:
            raise EngineRefused(f"engine vllm cannot serve it: {vllm.message}", [vllm])
        return Choice(VLLM, f"engine vllm, as requested (vLLM {platform.vllm_version}){unread}")
    if builtin is None:
        if checkpoint.not_read:
            return Choice(
                BUILTIN,
                f"auto: the built-in engine, assumed{unread} (its worker checks config.json "
                "when it loads; deploy with engine vllm for what the built-in engine does not run)",
            )
        return Choice(
            BUILTIN,
            f"auto: the built-in engine serves it (model_type {checkpoint.model_type!r}, "
            "not quantized, one accelerator)",
        )
    vllm = vllm_refusal(checkpoint, platform)
    if vllm is None:
        return Choice(
            VLLM,
            f"auto: vLLM {platform.vllm_version} serves it; the built-in engine cannot "
            f"({builtin.message}){unread}",
        )
    raise EngineRefused(
        f"neither engine can serve it: builtin: {builtin.message}; vllm: {vllm.message}",
        [builtin, vllm],
    )


def builtin_refusal(checkpoint: Checkpoint, accelerator_count: int) -> Refusal | None:
    """Why the built-in engine cannot serve it; None when it can (or, unread, may)."""
    if accelerator_count > 1:
        return Refusal(
            "accelerator_count",
            f"accelerator_count {accelerator_count}: the built-in engine runs a model on one "
            "accelerator (tensor parallelism is vLLM's)",
        )
    if checkpoint.quant_method is not None:
        return Refusal(
            "model",
            f"quantized weights ({checkpoint.quant_method}): the built-in engine runs float32, "
            "float16 and bfloat16 weights",
        )
    if checkpoint.builtin_refusal is not None:
        return Refusal("model", checkpoint.builtin_refusal)
    return None


def vllm_refusal(checkpoint: Checkpoint, platform: Platform) -> Refusal | None:
    """Why vLLM cannot serve it; None when it can (or, unread, may: its worker then says)."""
    if not platform.has_vllm:
        return Refusal(
            "engine",
            "this platform has no vLLM environment (its operator sets PLATFORM_VLLM_PYTHON, or "
            "PLATFORM_KUBERNETES_VLLM_IMAGE on Kubernetes)",
        )
    if checkpoint.not_read:
        return None
    version = platform.vllm_version
    if not checkpoint.architectures:
        return Refusal(
            "model", "config.json names no architectures (vLLM picks its model class by them)"
        )
    if not any(a in platform.vllm_architectures for a in checkpoint.architectures):
        return Refusal(
            "model",
            f"architecture {', '.join(checkpoint.architectures)} is not among vLLM {version}'s "
            "text-generation models",
        )
    method = checkpoint.quant_method
    if method is not None and method not in platform.vllm_quant_methods:
        return Refusal("model", f"quantization method {method!r} is not one vLLM {version} loads")
    return None


def _quant_method(raw: Any) -> str | None:
    """quantization_config's method; None when there is none (an empty one is none)."""
    if not raw:
        return None
    method = raw.get("quant_method") if isinstance(raw, dict) else None
    return method if isinstance(method, str) and method else "unknown"

"""The engine choice (control_plane/domain/engine_choice.py), rule by rule: every requested
engine against every kind of checkpoint, with and without vLLM on the platform."""

from __future__ import annotations

from typing import Any

import pytest

from common.messages import ENGINES
from control_plane.domain.engine_choice import (
    AUTO,
    BUILTIN,
    REQUESTS,
    VLLM,
    Checkpoint,
    EngineRefused,
    Platform,
    choose,
)

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
}
MIXTRAL = {**LLAMA, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}
GEMMA2 = {**LLAMA, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}
FP8 = {**LLAMA, "quantization_config": {"quant_method": "fp8"}}
GPTQ = {**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 4}}
YARN = {**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
# neither: an architecture vLLM does not list, or a method it does not load
ENCODER = {**LLAMA, "model_type": "bert", "architectures": ["BertModel"]}
NO_ARCH = {k: v for k, v in MIXTRAL.items() if k != "architectures"}
ODD_QUANT = {**LLAMA, "quantization_config": {"quant_method": "my-own-4bit"}}
HF = Checkpoint.unread("hf:// models are not read at deploy")

WITH_VLLM, WITHOUT_VLLM = Platform(has_vllm=True), Platform(has_vllm=False)


def cp(config: dict[str, Any]) -> Checkpoint:
    return Checkpoint.from_config(config)


# (requested, checkpoint, accelerator_count, platform) -> engine, and words of its reason
CHOSEN = [
    (AUTO, cp(LLAMA), 1, WITH_VLLM, BUILTIN, "the built-in engine serves it"),
    (AUTO, cp(LLAMA), 1, WITHOUT_VLLM, BUILTIN, "model_type 'llama'"),
    (AUTO, cp(MIXTRAL), 1, WITH_VLLM, VLLM, "model_type: 'mixtral' is not supported"),
    (AUTO, cp(GEMMA2), 1, WITH_VLLM, VLLM, "vLLM"),
    (AUTO, cp(FP8), 1, WITH_VLLM, VLLM, "quantized weights (fp8)"),
    (AUTO, cp(GPTQ), 1, WITH_VLLM, VLLM, "quantized weights (gptq)"),
    (AUTO, cp(YARN), 1, WITH_VLLM, VLLM, "rope_scaling"),
    (AUTO, cp(LLAMA), 2, WITH_VLLM, VLLM, "accelerator_count 2"),
    (BUILTIN, cp(LLAMA), 1, WITHOUT_VLLM, BUILTIN, "as requested"),
    (VLLM, cp(LLAMA), 1, WITH_VLLM, VLLM, "as requested"),
    (VLLM, cp(MIXTRAL), 8, WITH_VLLM, VLLM, "as requested"),
    # hf:// (not read): assumed the built-in engine, said so; vLLM for tensor parallelism
    (AUTO, HF, 1, WITH_VLLM, BUILTIN, "assumed; hf:// models are not read at deploy"),
    (AUTO, HF, 4, WITH_VLLM, VLLM, "hf:// models are not read at deploy"),
    (BUILTIN, HF, 1, WITHOUT_VLLM, BUILTIN, "hf:// models are not read"),
    (VLLM, HF, 2, WITH_VLLM, VLLM, "hf:// models are not read"),
]


@pytest.mark.parametrize(("requested", "checkpoint", "n", "platform", "engine", "words"), CHOSEN)
def test_the_engine_chosen_and_why(
    requested: str, checkpoint: Checkpoint, n: int, platform: Platform, engine: str, words: str
) -> None:
    choice = choose(requested, checkpoint, n, platform)
    assert choice.engine == engine
    assert words in choice.reason, choice.reason


# (requested, checkpoint, accelerator_count, platform) -> refused: the fields and words
REFUSED = [
    # builtin asked for what it cannot serve
    (BUILTIN, cp(MIXTRAL), 1, WITH_VLLM, ["model"], "model_type: 'mixtral' is not supported"),
    (BUILTIN, cp(FP8), 1, WITH_VLLM, ["model"], "quantized weights (fp8)"),
    (BUILTIN, cp(YARN), 1, WITH_VLLM, ["model"], "rope_scaling: rope_type 'yarn'"),
    (BUILTIN, cp(LLAMA), 2, WITH_VLLM, ["accelerator_count"], "one accelerator"),
    (BUILTIN, HF, 2, WITH_VLLM, ["accelerator_count"], "accelerator_count 2"),
    # vllm on a platform without it, or for what it does not list
    (VLLM, cp(LLAMA), 1, WITHOUT_VLLM, ["engine"], "no vLLM environment"),
    (VLLM, HF, 1, WITHOUT_VLLM, ["engine"], "no vLLM environment"),
    (VLLM, cp(ENCODER), 1, WITH_VLLM, ["model"], "architecture BertModel is not among"),
    (VLLM, cp(NO_ARCH), 1, WITH_VLLM, ["model"], "names no architectures"),
    (VLLM, cp(ODD_QUANT), 1, WITH_VLLM, ["model"], "'my-own-4bit' is not one vLLM"),
    # auto: neither can serve it, both reasons given
    (AUTO, cp(MIXTRAL), 1, WITHOUT_VLLM, ["model", "engine"], "builtin: config.json"),
    (AUTO, cp(FP8), 1, WITHOUT_VLLM, ["model", "engine"], "vllm: this platform has no vLLM"),
    (AUTO, cp(LLAMA), 2, WITHOUT_VLLM, ["accelerator_count", "engine"], "neither engine"),
    (AUTO, HF, 2, WITHOUT_VLLM, ["accelerator_count", "engine"], "neither engine"),
    (AUTO, cp(ENCODER), 1, WITH_VLLM, ["model", "model"], "architecture BertModel"),
    (AUTO, cp(ODD_QUANT), 1, WITH_VLLM, ["model", "model"], "quantized weights (my-own-4bit)"),
]


@pytest.mark.parametrize(("requested", "checkpoint", "n", "platform", "fields", "words"), REFUSED)
def test_what_the_allowed_engines_cannot_serve_is_refused_saying_why(
    requested: str,
    checkpoint: Checkpoint,
    n: int,
    platform: Platform,
    fields: list[str],
    words: str,
) -> None:
    with pytest.raises(EngineRefused) as err:
        choose(requested, checkpoint, n, platform)
    assert [r.field for r in err.value.refusals] == fields
    assert words in err.value.summary, err.value.summary
    assert str(err.value) == err.value.summary
    # every reason is in the summary
    for r in err.value.refusals:
        assert r.message in err.value.summary


def test_the_facts_read_from_a_config() -> None:
    facts = cp(GPTQ)
    assert (facts.model_type, facts.architectures, facts.quant_method) == (
        "llama",
        ("LlamaForCausalLM",),
        "gptq",
    )
    # the built-in engine's own parser refuses quantized configs too (the worker's parser)
    assert facts.builtin_refusal is not None and "quantization_config" in facts.builtin_refusal
    assert cp(LLAMA).builtin_refusal is None and cp(LLAMA).quant_method is None
    # an empty quantization_config is none; one without a method is an unknown method
    assert cp({**LLAMA, "quantization_config": {}}).quant_method is None
    assert cp({**LLAMA, "quantization_config": {"bits": 4}}).quant_method == "unknown"
    # odd shapes are facts, never exceptions
    odd = cp({"architectures": "LlamaForCausalLM", "model_type": 3, "quantization_config": 1})
    assert (odd.architectures, odd.model_type, odd.quant_method) == ((), None, "unknown")
    assert odd.builtin_refusal is not None


def test_an_unknown_request_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="expected one of auto, builtin, vllm"):
        choose("tgi", cp(LLAMA), 1, WITH_VLLM)


def test_the_engines_are_the_wire_contracts() -> None:
    assert set(ENGINES) == {BUILTIN, VLLM} and set(REQUESTS) == {AUTO, *ENGINES}

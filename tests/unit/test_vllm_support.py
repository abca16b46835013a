"""control_plane/domain/vllm_support.py is generated from vLLM's own source by
tests/tools/vllm_support.py: it must match the vLLM installed in the repository's .venv-vllm
(skipped without one), and hold what the engine choice relies on."""

from __future__ import annotations

import difflib

import pytest

from control_plane.domain import vllm_support
from tests.tools import vllm_support as generator


def test_the_module_matches_the_installed_vllm() -> None:
    vllm_dir = generator.find_vllm()
    if vllm_dir is None:
        pytest.skip("no .venv-vllm in the repository (make vllm-venv)")
    expected = generator.render(vllm_dir)
    actual = generator.TARGET.read_text(encoding="utf-8")
    diff = difflib.unified_diff(actual.splitlines(), expected.splitlines(), lineterm="")
    assert actual == expected, (
        "control_plane/domain/vllm_support.py is stale: run python tests/tools/vllm_support.py\n"
        + "\n".join(list(diff)[:40])
    )


def test_it_lists_the_families_and_methods_the_engine_choice_relies_on() -> None:
    assert vllm_support.VLLM_VERSION.count(".") >= 2
    # the built-in engine's families, and some it does not run
    for arch in ("LlamaForCausalLM", "MixtralForCausalLM", "Gemma2ForCausalLM"):
        assert arch in vllm_support.ARCHITECTURES
    for method in ("fp8", "gptq", "awq", "compressed-tensors"):
        assert method in vllm_support.QUANT_METHODS
    # text generation only: encoders and embedding models are not in it
    assert "BertModel" not in vllm_support.ARCHITECTURES

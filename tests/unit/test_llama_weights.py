"""Building the model from a checkpoint's tensors: bad tensors are named, fused q/k/v and gate/up
tensors are accepted and split back to HF names bit for bit, and the loader streams straight
into the fused tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.model_config import ModelConfig
from tests.unit.hf_reference import _our_model, _save_hf_model
from worker.model.weights import build_model, hf_state_dict


def test_build_model_names_bad_tensors(tmp_path: Path) -> None:
    _save_hf_model("llama_gqa", tmp_path)
    config = ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    weights = load_file(str(tmp_path / "model.safetensors"))

    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing tensors: model\.norm\.weight"):
        build_model(config, missing)
    extra = {**weights, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.9\.mlp\.up_proj"):
        build_model(config, extra)
    bad = {**weights, "lm_head.weight": torch.zeros(3, 64)}
    with pytest.raises(ValueError, match=r"mis-shaped tensors: lm_head\.weight \(3, 64\)"):
        build_model(config, bad)

    model = build_model(config, weights, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_fused_tensors_are_accepted_and_split_back(tmp_path: Path) -> None:
    _save_hf_model("qwen2_qkv_bias", tmp_path)
    config = ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    weights = load_file(str(tmp_path / "model.safetensors"))
    model = build_model(config, weights)
    # HF names out again, bit for bit
    again = hf_state_dict(model)
    assert again.keys() == weights.keys()
    assert all(torch.equal(again[k], weights[k]) for k in weights)
    save_file(again, str(tmp_path / "copy.safetensors"))

    # a loader may hand over q/k/v (or gate/up) already fused
    fused = {
        k: v
        for k, v in weights.items()
        if ".q_proj." not in k and ".k_proj." not in k and ".v_proj." not in k
    }
    for name, tensor in model.state_dict().items():
        if ".qkv_proj." in name:
            fused[name] = tensor.clone()
    rebuilt = build_model(config, fused)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(rebuilt.state_dict()[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["qwen2_qkv_bias", "llama_mqa_tied", "qwen3_qk_norm"])
def test_the_loader_streams_straight_into_fused_tensors(name: str, tmp_path: Path) -> None:
    """With `load_name_map` the loader hands over q/k/v and gate/up already fused (no copy
    after the load); the model is the one built from the HF tensors, bit for bit."""
    import loader
    from worker.model.weights import load_name_map

    _save_hf_model(name, tmp_path)
    config = ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    tensors = loader.load(str(tmp_path), name_map=load_name_map(config)).tensors
    assert not any(".q_proj." in n or ".gate_proj." in n for n in tensors)
    assert any(n.endswith("qkv_proj.weight") for n in tensors)
    if config.qkv_bias:
        assert any(n.endswith("qkv_proj.bias") for n in tensors)
    want = _our_model(tmp_path).state_dict()
    got = build_model(config, tensors).state_dict()
    assert got.keys() == want.keys()
    for n, t in want.items():
        assert torch.equal(got[n], t), n

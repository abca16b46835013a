"""The worker loads a model directory through the loader into a typed `LoadedModel`: weights
bitwise those `safetensors` reads, eos ids from config.json and generation_config.json, the
context from the model's positions, and the load's metrics; a missing file is a LoaderError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from loader import ObjectNotFound
from worker.model.demo import create_demo_model
from worker.model.weights import build_model
from worker.runtime.loading import load_model


def test_a_model_directory_loads_into_a_loaded_model(tmp_path: Path) -> None:
    checkpoint = create_demo_model(tmp_path / "m", seed=0, train_steps=0)
    config = json.loads((checkpoint / "config.json").read_text())
    gen_path = checkpoint / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    gen_path.write_text(json.dumps({**gen, "eos_token_id": [*gen["eos_token_id"], 7]}))

    loaded = load_model(str(checkpoint))

    assert loaded.eos_token_ids == frozenset([config["eos_token_id"], 7])
    assert loaded.max_context == config["max_position_embeddings"]
    assert loaded.metrics.num_objects == 1 and loaded.metrics.device == "cpu"
    assert loaded.tokenizer.get_vocab_size() == config["vocab_size"]
    want = build_model(loaded.model.config, load_file(str(checkpoint / "model.safetensors")))
    got = loaded.model.state_dict()
    for name, tensor in want.state_dict().items():
        assert torch.equal(got[name], tensor), name


def test_a_missing_file_is_a_loader_error(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match=r"config\.json: no such file"):
        load_model(str(tmp_path))

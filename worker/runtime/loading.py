"""Load a model directory (config, tokenizer, weights) through the loader into a Generator."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from loader import LoaderError, exists, join_uri, load_model_dir, read_bytes

log = logging.getLogger(__name__)


def load_generator(model_uri: str) -> Any:
    """Return a ready `worker.engine.generate.Generator` for the model at `model_uri`."""
    from tokenizers import Tokenizer

    from worker.engine.generate import Generator
    from worker.model.config import ModelConfig
    from worker.model.weights import build_model

    t0 = time.monotonic()
    config = ModelConfig.from_hf_dict(json.loads(read_bytes(join_uri(model_uri, "config.json"))))
    tokenizer = Tokenizer.from_str(read_bytes(join_uri(model_uri, "tokenizer.json")).decode())
    eos_ids = set(config.eos_token_ids)
    gen_uri = join_uri(model_uri, "generation_config.json")
    if exists(gen_uri):
        gen_cfg: dict[str, Any] = json.loads(read_bytes(gen_uri))
        eos = gen_cfg.get("eos_token_id")
        eos_ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    t1 = time.monotonic()
    weights = load_model_dir(model_uri)
    size_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    t2 = time.monotonic()
    model = build_model(config, weights)
    log.info(
        "loaded %d tensors (%d bytes) in %.2fs (files %.2fs, weights %.2fs, build %.2fs)",
        len(weights),
        size_bytes,
        time.monotonic() - t0,
        t1 - t0,
        t2 - t1,
        time.monotonic() - t2,
    )
    return Generator(model, tokenizer, eos_ids, max_context=config.max_position_embeddings)


__all__ = ["LoaderError", "load_generator"]

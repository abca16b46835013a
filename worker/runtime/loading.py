"""Load a model directory (config, tokenizer, weights) through the loader into a Generator."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from loader import LoaderError, LoadOptions, exists, join_uri, load, read_bytes

log = logging.getLogger(__name__)


def load_generator(model_uri: str, device: str = "cpu", options: LoadOptions | None = None) -> Any:
    """Return a ready `worker.engine.generate.Generator` for the model at `model_uri`.

    Every weight byte comes through `loader.load` (concurrent ranged GETs straight into the
    destination; on CUDA through the pinned staging ring); a LoaderError leaves nothing loaded.
    """
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
    result = load(model_uri, device=device, options=options)
    m = result.metrics
    t2 = time.monotonic()
    model = build_model(config, result.tensors)
    log.info(
        "loaded %d tensors (%d bytes, %d objects) in %.2fs (files %.2fs, weights %.2fs at "
        "%.2f GB/s [header %.2fs, fetch %.2fs, copy %.2fs], %d retries, %d cache hits; "
        "build %.2fs)",
        len(result.tensors),
        m.bytes_total,
        m.num_objects,
        time.monotonic() - t0,
        t1 - t0,
        t2 - t1,
        m.gbps,
        m.phases_s["header"],
        m.phases_s["fetch"],
        m.phases_s["copy"],
        m.num_retries,
        m.cache_hits,
        time.monotonic() - t2,
    )
    return Generator(model, tokenizer, eos_ids, max_context=config.max_position_embeddings)


__all__ = ["LoaderError", "load_generator"]

"""Load a model directory (config, tokenizer, weights) through the loader: a `LoadedModel`.

>>> loaded = load_model("s3://models/demo/", device="cuda", options=settings.load_options())
>>> engine = LLMEngine.from_model(loaded.model, loaded.tokenizer, loaded.eos_token_ids, config)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader import (
    LoaderError,
    LoadMetrics,
    LoadOptions,
    Progress,
    exists,
    join_uri,
    load,
    read_bytes,
)

if TYPE_CHECKING:
    import tokenizers

    from worker.model.llama import LlamaModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model ready to serve: what the runtime builds its engine from."""

    model: LlamaModel  # eval-mode weights on the target device (`model.config` its config)
    tokenizer: tokenizers.Tokenizer  # from tokenizer.json
    eos_token_ids: frozenset[int]  # config.json's eos ids and generation_config.json's
    max_context: int  # most tokens (prompt + generated) of one request: the model's positions
    metrics: LoadMetrics  # what the weight load did (bytes, phase times, retries, cache hits)


def load_model(
    model_uri: str,
    device: str = "cpu",
    options: LoadOptions | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> LoadedModel:
    """The model at `model_uri`, loaded onto `device`; `on_progress` sees the weight bytes land
    (loader threads call it: keep it short).

    Every weight byte comes through `loader.load` (concurrent ranged GETs straight into the
    destination; on CUDA through the pinned staging ring); a LoaderError leaves nothing loaded.
    """
    from tokenizers import Tokenizer

    from worker.model.config import ModelConfig
    from worker.model.weights import build_model, load_name_map

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
    # q/k/v and gate/up stream straight into their fused tensors
    result = load(
        model_uri,
        device=device,
        options=options,
        name_map=load_name_map(config),
        on_progress=on_progress,
    )
    m = result.metrics
    t2 = time.monotonic()
    model = build_model(config, result.tensors)
    log.info(
        "loaded %d tensors (%d bytes, %d objects) in %.2fs (files %.2fs, weights %.2fs at "
        "%.2f GB/s [header %.2fs, fetch %.2fs, copy %.2fs], %d retries, %d cache hits %s; "
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
        m.tier_hits,
        time.monotonic() - t2,
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=frozenset(eos_ids),
        max_context=config.max_position_embeddings,
        metrics=m,
    )


__all__ = ["LoadedModel", "LoaderError", "load_model"]

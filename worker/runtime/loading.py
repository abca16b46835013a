"""Load a model directory (config, tokenizer, weights) through the loader: a `LoadedModel`.

>>> loaded = load_model("s3://models/demo/", device="cuda", options=settings.load_options())
>>> engine = LLMEngine.from_model(loaded.model, loaded.tokenizer, loaded.eos_token_ids, config)
>>> threading.Thread(target=loaded.fill_tiers, name="fill-tiers", daemon=True).start()
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader import (
    Fused,
    LoaderError,
    LoadMetrics,
    LoadOptions,
    NameMap,
    ObjectStore,
    Progress,
    TierFill,
    join_uri,
    load,
)

if TYPE_CHECKING:
    import tokenizers

    from common.model_config import ModelConfig
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
    tier_fill: TierFill | None = None  # cache entries the load left to write (`fill_tiers`)

    def fill_tiers(self) -> None:
        """Write the cache-tier entries the load missed, from storage or a slower tier.

        Blocking (seconds to minutes): run it in a daemon thread once the model serves. It
        never raises and never touches the model; a second call waits for the first and
        writes nothing; never calling it leaves the tiers as they were. Logs what it wrote
        or why not (a fill cut off by the process exiting leaves no partial entry).
        """
        fill_tiers(self.tier_fill)


def fill_tiers(tier_fill: TierFill | None) -> None:
    """`LoadedModel.fill_tiers` without the model: a caller that lets the model go first (a
    worker that stopped serving) keeps only this."""
    if tier_fill is None or not tier_fill.jobs:
        return
    report = tier_fill.run()
    if report.filled:
        log.info(
            "cache tiers filled in %.2fs: %s",
            report.seconds,
            ", ".join(f"{tier} {uri}" for tier, uri in report.filled),
            extra={"duration_s": round(report.seconds, 3)},
        )
    for uri, reason in report.failed.items():
        log.warning("cache tier fill of %s failed: %s", uri, reason)


@dataclass(frozen=True, slots=True)
class _ModelFiles:
    """config.json, tokenizer.json and generation_config.json, parsed."""

    config: ModelConfig  # the model's architecture
    tokenizer: tokenizers.Tokenizer  # from tokenizer.json
    eos_token_ids: frozenset[int]  # config.json's eos ids and generation_config.json's
    seconds: float  # wall time of reading and parsing them


def _read_model_files(store: ObjectStore, model_uri: str, t0: float) -> _ModelFiles:
    """The three small files, read concurrently through `store` (one set of S3 credentials;
    a missing generation_config.json costs one request, not two)."""
    from tokenizers import Tokenizer

    from common.model_config import ModelConfig

    names = ("config.json", "tokenizer.json", "generation_config.json")
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="model-files") as pool:
        config_f, tokenizer_f = (
            pool.submit(store.read_bytes, join_uri(model_uri, n)) for n in names[:2]
        )
        gen_f = pool.submit(store.read_if_exists, join_uri(model_uri, names[2]))
        config = ModelConfig.from_hf_dict(json.loads(config_f.result()))
        tokenizer = Tokenizer.from_str(tokenizer_f.result().decode())
        gen_raw = gen_f.result()
    eos_ids = set(config.eos_token_ids)
    if gen_raw is not None:
        gen_cfg: dict[str, Any] = json.loads(gen_raw)
        eos = gen_cfg.get("eos_token_id")
        eos_ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return _ModelFiles(config, tokenizer, frozenset(eos_ids), time.monotonic() - t0)


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
    The small files are read while the loader reads the weights' headers (it needs the config
    only to plan the fused tensors), through the same `ObjectStore`.
    """
    from worker.model.weights import build_model, load_name_map

    options = options or LoadOptions()
    store = ObjectStore(options.s3)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-files") as pool:
        files_f = pool.submit(_read_model_files, store, model_uri, t0)
        name_maps: list[NameMap] = []

        def name_map(name: str) -> str | Fused | None:
            # q/k/v and gate/up stream straight into their fused tensors; the loader first
            # calls this after the headers (its thread), so the config has had that long
            if not name_maps:
                name_maps.append(load_name_map(files_f.result().config))
            return name_maps[0](name)

        try:
            result = load(
                model_uri,
                device=device,
                options=options,
                name_map=name_map,
                on_progress=on_progress,
                store=store,
            )
        except LoaderError:
            files_f.result()  # a missing or unreadable config.json is the first thing to fix
            raise
        files = files_f.result()
    m = result.metrics
    t2 = time.monotonic()
    model = build_model(files.config, result.tensors)
    load_s = time.monotonic() - t0
    log.info(
        "loaded %d tensors (%d bytes, %d objects) in %.2fs (files %.2fs, weights %.2fs at "
        "%.2f GB/s [header %.2fs, fetch %.2fs, copy %.2fs], %d retries, %d cache hits %s; "
        "build %.2fs)",
        len(result.tensors),
        m.bytes_total,
        m.num_objects,
        load_s,
        files.seconds,  # NOTE: overlaps the weights' header phase
        m.seconds,
        m.gbps,
        m.phases_s["header"],
        m.phases_s["fetch"],
        m.phases_s["copy"],
        m.num_retries,
        m.cache_hits,
        m.tier_hits,
        time.monotonic() - t2,
        extra={"duration_s": round(load_s, 3)},
    )
    return LoadedModel(
        model=model,
        tokenizer=files.tokenizer,
        eos_token_ids=files.eos_token_ids,
        max_context=files.config.max_position_embeddings,
        metrics=m,
        tier_fill=result.fill,
    )


__all__ = ["LoadedModel", "LoaderError", "fill_tiers", "load_model"]

"""What a worker does before it serves: the runtime's imports and device (`prepare_runtime`),
the engine over the loaded model (`build_engine`), and one short warm-up (`warm_up`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from common import heap
from common.messages import Assignment
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from worker.engine.llm_engine import LLMEngine
    from worker.runtime.loading import LoadedModel

log = logging.getLogger(__name__)


def prepare_runtime(accelerator: str, collect: bool) -> None:
    """What a cold start pays before it can load anything: importing torch, the model, engine
    and loader code, and (on a GPU) creating the device context; `collect`: the imports'
    garbage too (~0.1 s), when nobody waits."""
    import tokenizers  # noqa: F401
    import torch

    import loader
    import worker.engine.llm_engine
    import worker.model.llama
    import worker.runtime.engine_loop
    import worker.runtime.loading  # noqa: F401

    loader.preload()  # the S3 client's imports
    if accelerator != "cpu":
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.empty(1, device="cuda")
    # NOTE: a full collection walks the runtime's ~200k objects (0.1 s on 2 cores), and the
    # allocations of a load or a model build trigger one: it fell inside cold starts.
    heap.settle(collect=collect)


def build_engine(
    settings: WorkerSettings, assignment: Assignment, loaded: LoadedModel
) -> LLMEngine:
    """A continuous-batching engine over the loaded model, sized for the assignment's
    concurrency; PLATFORM_ENGINE_* settings override the engine's defaults (ValueError if
    invalid)."""
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine

    config = EngineConfig(
        max_num_seqs=assignment.max_concurrency,
        max_model_len=loaded.max_context,
        **settings.engine_overrides(),  # type: ignore[arg-type]
    )
    engine = LLMEngine.from_model(loaded.model, loaded.tokenizer, loaded.eos_token_ids, config)
    log.info(
        "engine: %d KV blocks of %d tokens, max_model_len %d, max_num_seqs %d, "
        "token budget %d, prefix caching %s",
        engine.cache.num_blocks,
        engine.cache.block_size,
        engine.cache.max_model_len,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        config.enable_prefix_caching,
    )
    return engine


def warm_up(engine: LLMEngine) -> None:
    """One short generation: it compiles kernels and touches every weight once."""
    from worker.engine.params import SamplingParams

    engine.add_request("warm-up", engine.encode("warm up"), SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()

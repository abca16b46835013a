"""What a worker does before it serves: the runtime's imports and device (`prepare_runtime`),
the model loaded and the engine built over it (`load_engine`: the built-in engine, or vLLM for
an assignment resolved to it), and one short warm-up (`warm_up`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common import heap
from common.messages import Assignment
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from loader import LoadMetrics, Progress, TierFill
    from worker.engine.llm_engine import LLMEngine
    from worker.runtime.loading import LoadedModel
    from worker.runtime.serving import ServingEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Served:
    """An engine ready to serve, and what loading its weights did."""

    engine: ServingEngine
    # the weight load's bytes, phases and tier hits (None: loaded in another process)
    metrics: LoadMetrics | None
    # the cache entries the load left to write (`loader.TierFill.run`), if any
    tier_fill: TierFill | None


def prepare_runtime(
    accelerator: str, collect: bool, engine: str = "builtin", threads: int = 0
) -> None:
    """What a cold start pays before it can load anything: importing torch, the model, engine
    and loader code (vLLM's, for a vLLM worker), and (on a GPU) creating the device context;
    `collect`: the imports' garbage too (~0.1 s), when nobody waits; `threads`: torch's
    intra-op threads (0: its default)."""
    import tokenizers  # noqa: F401
    import torch

    if threads > 0:
        torch.set_num_threads(threads)

    import loader
    import worker.engine.llm_engine
    import worker.model.llama
    import worker.runtime.engine_loop
    import worker.runtime.loading  # noqa: F401

    loader.preload()  # the S3 client's imports
    if engine == "vllm":
        from worker.vllm.build import prepare_vllm

        prepare_vllm()
    if accelerator != "cpu":
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.empty(1, device="cuda")
    # NOTE: a full collection walks the runtime's ~200k objects (0.1 s on 2 cores), and the
    # allocations of a load or a model build trigger one: it fell inside cold starts.
    heap.settle(collect=collect)


def load_engine(
    settings: WorkerSettings,
    assignment: Assignment,
    accelerator: str,
    on_progress: Callable[[Progress], None] | None = None,
) -> Served:
    """The assignment's model loaded (through the loader: its tiers, the tenant's
    credentials) and its engine built: the built-in engine, or vLLM's."""
    if assignment.engine == "vllm":
        from worker.vllm.build import build_vllm_engine

        vllm_engine, pending = build_vllm_engine(settings, assignment, accelerator, on_progress)
        return Served(vllm_engine, pending.metrics, pending.tier_fill)
    from worker.runtime.loading import load_model

    if accelerator == "cpu":
        from worker.model import greedy_head, native_attention, native_ops
        from worker.model.native_build import prepare_in_background

        # the CPU kernels' first build on this machine (~0.2 s each) runs beside the weight
        # load instead of after it
        prepare_in_background(
            native_attention.LIBRARY,
            native_attention.PREFILL_LIBRARY,
            native_ops.LIBRARY,
            greedy_head.LIBRARY,
        )
    # a GPU worker loads straight into device memory; "cpu" workers stay on the host
    loaded = load_model(
        assignment.model_uri,
        device="cpu" if accelerator == "cpu" else "cuda",
        options=settings.load_options(),
        on_progress=on_progress,
    )
    return Served(build_engine(settings, assignment, loaded), loaded.metrics, loaded.tier_fill)


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


def warm_up(engine: ServingEngine) -> None:
    """One short generation: it compiles kernels and touches every weight once."""
    from worker.engine.params import SamplingParams

    engine.add_request("warm-up", engine.encode("warm up"), SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()

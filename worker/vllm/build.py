"""`build_vllm_engine`: a vLLM engine for an assignment, its weights through the loader.

>>> engine, load = build_vllm_engine(settings, assignment, "cpu", on_progress)
>>> load.metrics  # what the weight load did (None when vLLM loaded in another process)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.messages import Assignment
from loader import ObjectStore
from worker.engine.config import CacheSpec
from worker.settings import WorkerSettings
from worker.vllm.model_files import fetch_small_files

if TYPE_CHECKING:
    from loader import Progress
    from worker.vllm.engine import VllmEngine
    from worker.vllm.model_loader import PendingLoad

log = logging.getLogger(__name__)

# The KV cache on a CPU host without an explicit size (PLATFORM_ENGINE_KV_CACHE_BYTES): room
# for every held job at full context, at most this much (the built-in engine's rule).
CPU_KV_CACHE_MAX_BYTES = 2 << 30
# vLLM's KV-cache block on a CPU, in tokens
VLLM_CPU_BLOCK = 128


def prepare_vllm() -> None:
    """vLLM's imports and the platform's model loader registered: a cold start's first
    seconds, which a warm-pool worker pays before it is assigned."""
    # vLLM's loggers go to the worker's own JSON lines (common/logs.py) instead of a console
    # handler of vLLM's; no usage reports (no network at run time)
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    import vllm.engine.arg_utils
    import vllm.v1.engine.llm_engine  # noqa: F401

    import worker.vllm.model_loader  # noqa: F401  (registers load_format "platform")


def build_vllm_engine(
    settings: WorkerSettings,
    assignment: Assignment,
    accelerator: str,
    on_progress: Callable[[Progress], None] | None = None,
) -> tuple[VllmEngine, PendingLoad]:
    """vLLM's engine over the assignment's model (weights streamed by the loader, with the
    tenant's credentials from this process's environment), behind `VllmEngine`."""
    from tokenizers import Tokenizer

    from worker.vllm.engine import VllmEngine
    from worker.vllm.model_loader import LOAD_FORMAT, PendingLoad, expect_load, take_load

    options = settings.load_options()
    t0 = time.monotonic()
    model_dir = fetch_small_files(ObjectStore(options.s3), assignment.model_uri)
    try:
        config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        _environment(settings, assignment, accelerator)
        prepare_vllm()  # (done already in a warm-pool worker)
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        key = uuid.uuid4().hex
        pending = PendingLoad(options, on_progress)
        expect_load(key, pending)
        try:
            args = EngineArgs(
                model=str(model_dir),
                load_format=LOAD_FORMAT,
                model_loader_extra_config={"uri": assignment.model_uri, "key": key},
                tensor_parallel_size=assignment.accelerator_count,
                max_num_seqs=assignment.max_concurrency,
                scheduling_policy="priority",
                # llguidance, as the built-in engine: the same grammars (JSON schema, regex,
                # Lark, choices) mean the same languages on either engine
                structured_outputs_config=StructuredOutputsConfig(backend="guidance"),
                enable_prefix_caching=settings.engine_enable_prefix_caching is not False,
                seed=0,
                # the checkpoint's own dtype, as the built-in engine serves it (vLLM's "auto"
                # would serve an fp32 checkpoint in 16 bits)
                dtype=checkpoint_dtype(config),
                **_sizes(settings, config, assignment, accelerator),
            )
            llm_engine = LLMEngine.from_engine_args(args)
        finally:
            take_load(key)
    finally:
        # vLLM has read its config and tokenizer: the directory is not needed any more
        shutil.rmtree(model_dir, ignore_errors=True)
    _log_load(pending)
    vconfig = llm_engine.vllm_config
    cache = CacheSpec(
        num_blocks=int(vconfig.cache_config.num_gpu_blocks or 0),
        block_size=int(vconfig.cache_config.block_size),
        max_model_len=int(vconfig.model_config.max_model_len),
    )
    engine = VllmEngine(
        llm_engine,
        tokenizer,
        cache,
        vocab_size=int(vconfig.model_config.get_vocab_size()),
        bos_token_id=_bos(config),
    )
    log.info(
        "vLLM engine ready in %.2fs: %d KV blocks of %d tokens, max_model_len %d, "
        "max_num_seqs %d, tensor parallel %d",
        time.monotonic() - t0,
        cache.num_blocks,
        cache.block_size,
        cache.max_model_len,
        assignment.max_concurrency,
        assignment.accelerator_count,
    )
    return engine, pending


def _log_load(pending: PendingLoad) -> None:
    """What the weight load did, in the built-in worker's words (one "loaded" line)."""
    m = pending.metrics
    if m is None:  # loaded by vLLM's rank processes
        return
    log.info(
        "loaded %d tensors (%d bytes, %d objects) in %.2fs (weights %.2fs at %.2f GB/s "
        "[header %.2fs, fetch %.2fs, copy %.2fs], %d retries, %d cache hits %s; into vLLM's "
        "model)",
        pending.tensors,
        m.bytes_total,
        m.num_objects,
        pending.seconds,
        m.seconds,
        m.gbps,
        m.phases_s.get("header", 0.0),
        m.phases_s.get("fetch", 0.0),
        m.phases_s.get("copy", 0.0),
        m.num_retries,
        m.cache_hits,
        m.tier_hits,
        extra={"duration_s": round(pending.seconds, 3)},
    )


def _environment(settings: WorkerSettings, assignment: Assignment, accelerator: str) -> None:
    """vLLM's process-wide switches, set before it is imported."""
    # One accelerator: the engine core in this process, so the loader's progress and metrics
    # reach the worker, and its scheduler's counters feed the heartbeat and /metrics. Several:
    # vLLM's own processes, one per rank (each loads through the loader: model_loader.py).
    single = assignment.accelerator_count == 1
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if single else "1"
    if accelerator == "cpu":
        # the worker's own thread count; vLLM would bind one thread per core otherwise
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        if settings.worker_threads:
            os.environ["OMP_NUM_THREADS"] = str(settings.worker_threads)


def _sizes(
    settings: WorkerSettings, config: dict[str, Any], assignment: Assignment, accelerator: str
) -> dict[str, Any]:
    """max_model_len, the KV cache and the token budget: the PLATFORM_ENGINE_* settings, else
    on a CPU the built-in engine's rule, else vLLM's own (a share of the GPU's memory)."""
    sizes: dict[str, Any] = {}
    if settings.engine_max_num_batched_tokens is not None:
        sizes["max_num_batched_tokens"] = settings.engine_max_num_batched_tokens
    if settings.engine_kv_cache_memory_fraction is not None:
        sizes["gpu_memory_utilization"] = settings.engine_kv_cache_memory_fraction
    kv_bytes = settings.engine_kv_cache_bytes
    if kv_bytes is None and accelerator == "cpu":
        per_token = kv_bytes_per_token(config)
        max_len = int(config.get("max_position_embeddings") or 2048)
        max_len = min(max_len, CPU_KV_CACHE_MAX_BYTES // (2 * per_token) - VLLM_CPU_BLOCK)
        sizes["max_model_len"] = max_len
        # NOTE: twice the estimate, plus a block per sequence: vLLM pages whole blocks per layer
        # group (a model mixing sliding-window and full layers keeps a group of each), so its
        # bytes per token run above this lower bound; it refuses a cache short of one sequence
        tokens = (max_len + VLLM_CPU_BLOCK) * assignment.max_concurrency
        kv_bytes = min(CPU_KV_CACHE_MAX_BYTES, 2 * per_token * tokens)
    if kv_bytes is not None:
        sizes["kv_cache_memory_bytes"] = kv_bytes
    return sizes


def kv_bytes_per_token(config: dict[str, Any]) -> int:
    """Bytes one token's keys and values take in every layer (fp32 upper bound: CPU)."""
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    return 2 * 4 * int(text["num_hidden_layers"]) * kv_heads * head_dim


def checkpoint_dtype(config: dict[str, Any]) -> str:
    """The dtype config.json names (transformers 5: "dtype", 4.x: "torch_dtype"), else vLLM's
    choice."""
    text = config.get("text_config") or {}
    for d in (config, text):
        for key in ("dtype", "torch_dtype"):
            if isinstance(d.get(key), str) and d[key] in ("float32", "float16", "bfloat16"):
                return str(d[key])
    return "auto"


def _bos(config: dict[str, Any]) -> int | None:
    bos = config.get("bos_token_id")
    if isinstance(bos, list):
        bos = bos[0] if bos else None
    return bos if isinstance(bos, int) else None

"""vLLM on one workload, in its own virtualenv: ``.venv-vllm/bin/python -m
bench.enginebench.vllm_runner SPEC`` (``make vllm-venv`` creates it). It imports only the
standard library and vLLM, so it runs without this project installed.

The spec is the one every runner reads (``runners.run_child``): the checkpoint, the requests,
the options, the intra-op threads and where to write the result. vLLM is driven as its offline
``LLM`` does (``LLM.generate`` is a loop over ``llm_engine.step()``), with the loop open so each
token's arrival time is seen: token ids in, no tokenizer, greedy, EOS ignored, fp32 like the
checkpoint, the engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one process, so
its peak RSS is all of it and it computes on the threads it is given, like the others), and its
KV cache sized like this engine's. Everything else is vLLM's default for CPU, start-up
compilation (inductor) included.

The first request is the cold one (``workloads.COLD_PROMPT``, one token): the time from process
start to its token is the "from zero" column (the parent knows when it started the process).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench.enginebench.workloads import COLD_PROMPT

# vLLM's KV block on CPU, in tokens
VLLM_BLOCK = 128


def kv_cache_bytes(config: dict[str, Any], num_tokens: int) -> int:
    """Bytes of an fp32 KV cache (keys and values, every layer) of ``num_tokens`` tokens."""
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    layers, kv_heads = int(config["num_hidden_layers"]), int(config["num_key_value_heads"])
    return 2 * 4 * layers * kv_heads * head_dim * num_tokens


def run(spec: dict[str, Any]) -> dict[str, Any]:
    threads = int(spec["threads"])
    # one process, these threads (vLLM binds its OpenMP threads itself otherwise)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    ckpt = Path(spec["checkpoint"])
    work = [(p, n) for p, n in spec["work"]]
    opts = spec["opts"]
    config = json.loads((ckpt / "config.json").read_text())
    max_model_len = int(config["max_position_embeddings"])
    # the engine's cache: every request's tokens plus a block each; at least one longest
    # sequence, which vLLM requires, in whole blocks of vLLM's CPU size (128), plus one
    capacity = max(sum(len(p) + n for p, n in work) + 16 * len(work), max_model_len)
    capacity = -(-capacity // VLLM_BLOCK) * VLLM_BLOCK + VLLM_BLOCK
    llm = LLM(
        model=str(ckpt),
        skip_tokenizer_init=True,
        dtype=opts["dtype"],
        max_model_len=max_model_len,
        max_num_seqs=len(work),
        max_num_batched_tokens=opts["max_num_batched_tokens"],
        enable_prefix_caching=opts.get("prefix_caching", True),
        kv_cache_memory_bytes=kv_cache_bytes(config, capacity),
        seed=0,
    )
    engine = llm.llm_engine

    def params(max_tokens: int) -> Any:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    engine.add_request("cold", TokensPrompt(prompt_token_ids=COLD_PROMPT), params(1))
    first_token_at = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first_token_at is None and out.outputs and out.outputs[0].token_ids:
                first_token_at = time.time()

    start = time.perf_counter()
    for i, (prompt, num_out) in enumerate(work):
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompt), params(num_out))
    tokens: list[list[int]] = [[] for _ in work]
    times: list[list[float]] = [[] for _ in work]
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            new = list(out.outputs[0].token_ids) if out.outputs else []
            i = int(out.request_id)  # the id given (vLLM adds a suffix inside only)
            tokens[i].extend(new)
            times[i].extend([now - start] * len(new))
    end = time.perf_counter()
    return {
        "tokens": tokens,
        "times": times,
        "wall_s": end - start,
        "first_token_at": first_token_at,
        "version": _version(),
    }


def _version() -> str:
    import vllm

    return str(vllm.__version__)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = run(spec)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(spec["out"]).write_text(json.dumps(result))
    sys.stdout.flush()
    # NOTE: vLLM's shutdown can hang on its background threads; the result is written
    os._exit(0)


if __name__ == "__main__":
    main()

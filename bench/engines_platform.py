"""The same Llama on each engine, behind the embedded platform: a request at zero workers timed
to its first token, and the steady throughput of a warm worker under a burst of requests.

    .venv/bin/python -m bench.engines_platform                 # 2 rounds, ~6 min on 2 cores
    .venv/bin/python -m bench.engines_platform --rounds 3 --requests 32

Needs the vLLM environment (`make vllm-venv`: `.venv-vllm`, or `--vllm-python`); without it
the vLLM rows are skipped with a message. One `platform up` (no warm pool: a cold start boots
a worker; no cache tiers: the weights come from object storage every time) serves both; each
round deploys the checkpoint once per engine (`engine: builtin`, `engine: vllm`; min 0, max 1,
target concurrency = `--requests`), the engines' order alternating between rounds, and for each:
- cold: a streamed run at zero workers, request sent -> first `output` event (boot, load,
  engine start, prefill, one decode step);
- steady: `--requests` async jobs submitted at once to the now warm worker (prompt lengths
  and output lengths from the Azure conversation trace, scaled as bench/engine.py's CPU
  workload; greedy; the end-of-sequence token banned with `logit_bias` so each job makes
  exactly its tokens), generated tokens / (last job's end - first submission);
then the deployment is deleted and its worker drained before the next.

The checkpoint: a random Llama of bench/engine.py's default shape (8 layers, hidden 512,
head_dim 64: vLLM's CPU attention has no kernel for smaller heads) with the demo model's
tokenizer (vocabulary 512). Workers run with one intra-op thread (PLATFORM_WORKER_THREADS=1).
The last line is one JSON object: {"bench": "engines_platform", "cold_s": {...},
"tok_s": {...}, "cold_vs_vllm": builtin / vllm, "tok_s_vs_vllm": builtin / vllm}.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.coldstart.driver import Platform
from bench.coldstart.models import Model
from bench.coldstart.scenarios import tier_env
from bench.coldstart.sse import sse_events
from bench.enginebench.workloads import SCALES
from bench.traces import WORKLOADS, clip, read_trace

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("builtin", "vllm")
TERMINAL = ("completed", "failed", "canceled", "timed_out", "error")
EOS = 1  # the demo tokenizer's </s>


def make_model(path: Path) -> Model:
    """The checkpoint (written once into `path`, reused)."""
    if not (path / "model.safetensors").exists():
        import torch
        import transformers

        from worker.model.demo import BOS_TOKEN, EOS_TOKEN, load_corpus, train_tokenizer

        tokenizer = train_tokenizer(load_corpus())
        config = transformers.LlamaConfig(
            vocab_size=tokenizer.get_vocab_size(),
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            initializer_range=0.05,
            bos_token_id=tokenizer.token_to_id(BOS_TOKEN),
            eos_token_id=tokenizer.token_to_id(EOS_TOKEN),
            tie_word_embeddings=False,
        )
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).save_pretrained(path)
        tokenizer.save(str(path / "tokenizer.json"))
    return Model("engines", path, (path / "model.safetensors").stat().st_size)


def workload(n: int) -> list[tuple[str, int]]:
    """`n` (prompt text, output tokens): the Azure trace's lengths scaled to this machine, a
    prompt being as many words of the bundled corpus (about a token each)."""
    from worker.model.demo import load_corpus

    words = " ".join(load_corpus()).split()
    rng = random.Random(0)
    scale = SCALES["cpu"]
    out = []
    for r in read_trace(WORKLOADS / "azure_llm_2023_conv.csv", limit=n):
        num_prompt = clip(r.prompt_tokens / scale.prompt_div, scale.prompt_min, scale.prompt_max)
        num_out = clip(r.output_tokens / scale.output_div, scale.output_min, scale.output_max)
        start = rng.randrange(0, len(words) - num_prompt)
        out.append((" ".join(words[start : start + num_prompt]), num_out))
    return out


def cold(p: Platform, name: str) -> float:
    """Seconds from a streamed run sent at zero workers to its first output event."""
    body = {"input": {"prompt": "The weather", "max_tokens": 4, "temperature": 0}, "stream": True}
    sent = time.time()
    first = None
    with p.http.stream("POST", f"/v1/deployments/{name}/run", json=body) as resp:
        resp.raise_for_status()
        for event, data in sse_events(resp.iter_lines()):
            if event == "output" and first is None:
                first = time.time()
            if event in TERMINAL:
                if event != "completed":
                    raise SystemExit(f"{name}: cold run ended {event}: {data}")
                break
    if first is None:
        raise SystemExit(f"{name}: no output event")
    return first - sent


def steady(p: Platform, name: str, work: list[tuple[str, int]]) -> tuple[float, int]:
    """(generated tokens per second, tokens) of `work` submitted at once to a warm worker."""
    t0 = time.time()
    ids = []
    for prompt, num_out in work:
        body = {
            "input": {
                "prompt": prompt,
                "max_tokens": num_out,
                "temperature": 0,
                "logit_bias": {str(EOS): -100},
            }
        }
        resp = p.http.post(f"/v1/deployments/{name}/jobs", json=body)
        resp.raise_for_status()
        ids.append(resp.json()["id"])

    def wait(job_id: str) -> dict[str, Any]:
        while True:
            job: dict[str, Any] = p.http.get(f"/v1/jobs/{job_id}").json()
            if job["status"] in ("succeeded", "failed", "canceled", "timed_out"):
                return job
            time.sleep(0.1)

    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = list(pool.map(wait, ids))
    bad = [j for j in jobs if j["status"] != "succeeded"]
    if bad:
        raise SystemExit(f"{name}: {len(bad)} jobs did not succeed: {bad[0].get('error')}")
    end = max(_ts(j["completed_at"]) for j in jobs)
    tokens = sum(int(j["usage"]["generated_tokens"]) for j in jobs)
    return tokens / (end - t0), tokens


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32, help="jobs of the steady burst")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--model-dir", type=Path, help="build the checkpoint here and keep it")
    args = ap.parse_args(argv)
    engines = list(ENGINES)
    if not Path(args.vllm_python).exists():
        print(f"# vllm: skipped: no interpreter at {args.vllm_python} (`make vllm-venv`)")
        engines.remove("vllm")
    work = workload(args.requests)
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        model = make_model(args.model_dir or Path(tmp) / "model")
        env = {
            "PLATFORM_WARM_POOL_MAX": "0",
            "PLATFORM_WORKER_THREADS": "1",
            "PLATFORM_VLLM_PYTHON": args.vllm_python if "vllm" in engines else "",
            **tier_env({}),
        }
        p = Platform(Path(tmp) / "state", env, {})
        try:
            up = p.upload(model, "api")
            results: dict[str, dict[str, list[float]]] = {
                e: {"cold": [], "tok_s": []} for e in engines
            }
            for r in range(args.rounds):
                order = engines if r % 2 == 0 else engines[::-1]
                for engine in order:
                    name = f"eng-{engine}-{r}-{p.token}"
                    spec = {
                        "name": name,
                        "model": up.store_uri,
                        "engine": engine,
                        "min_workers": 0,
                        "max_workers": 1,
                        "target_concurrency": args.requests,
                        "scaledown_window_s": 600,
                    }
                    p.http.post("/v1/deployments", json=spec).raise_for_status()
                    cold_s = cold(p, name)
                    tok_s, tokens = steady(p, name, work)
                    results[engine]["cold"].append(cold_s)
                    results[engine]["tok_s"].append(tok_s)
                    print(
                        f"round {r} {engine:8s} cold {cold_s:6.2f} s   steady {tok_s:7.1f} tok/s "
                        f"({tokens} tokens)",
                        flush=True,
                    )
                    p.http.delete(f"/v1/deployments/{name}").raise_for_status()
                    p.wait_no_workers()
        finally:
            p.close()
    report(results, work, args)


def report(
    results: dict[str, dict[str, list[float]]], work: list[tuple[str, int]], args: Any
) -> None:
    med = {e: {k: statistics.median(v) for k, v in r.items()} for e, r in results.items()}
    print(
        f"\n{len(work)} requests, {sum(n for _, n in work)} output tokens; "
        f"{args.rounds} rounds; medians"
    )
    print("| engine | request at zero -> first token (s) | steady tok/s |")
    print("|---|--:|--:|")
    for e, m in med.items():
        print(f"| {e} | {m['cold']:.2f} | {m['tok_s']:.1f} |")
    line: dict[str, Any] = {
        "bench": "engines_platform",
        "cold_s": {e: round(m["cold"], 3) for e, m in med.items()},
        "tok_s": {e: round(m["tok_s"], 1) for e, m in med.items()},
    }
    if "vllm" in med:
        line["cold_vs_vllm"] = round(med["builtin"]["cold"] / med["vllm"]["cold"], 3)
        line["tok_s_vs_vllm"] = round(med["builtin"]["tok_s"] / med["vllm"]["tok_s"], 3)
    print(json.dumps(line))


if __name__ == "__main__":
    main()

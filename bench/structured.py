"""What structured outputs cost: the engine's throughput with every request constrained by a
JSON schema (or a regex) against the same requests unconstrained, measured in one run,
interleaved round by round (best round kept).

The model is `bench/engine.py`'s random Llama (56.9M parameters, fp32, a 32,000-token
vocabulary) with a byte-level BPE tokenizer of that size trained here on a synthetic corpus
(seeded), so masks are computed over a realistic vocabulary. The grammars never end within
`max_tokens` (an array of 40 short strings; a long regex), so both runs generate exactly the
same number of tokens and only the masking differs. One intra-op thread for torch; llguidance
computes a step's masks on its own threads while the model runs.

    .venv/bin/python -m bench.structured            # ~3 minutes
    .venv/bin/python -m bench.structured --quick    # a smoke test
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.enginebench.model import make_checkpoint

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "words": {
            "type": "array",
            "items": {"type": "string", "maxLength": 8},
            "minItems": 40,
            "maxItems": 40,
        },
    },
    "required": ["id", "kind", "words"],
    "additionalProperties": False,
}
REGEX = r"([a-z]{1,6} ){200}"


def make_tokenizer(path: Path, vocab_size: int) -> Any:
    """A byte-level BPE of `vocab_size` tokens trained on seeded synthetic text and JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["th", "sh", "st"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(60_000)]
    lines = []
    for _ in range(40_000):
        lines.append(" ".join(rng.choices(words, k=rng.randint(5, 20))) + rng.choice(".,!?:;"))
        lines.append(json.dumps({rng.choice(words): rng.choice([rng.randint(0, 10**6), None])}))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.save(str(path))
    return tokenizer


def run(engine: Any, work: list[list[int]], params: Any) -> dict[str, float]:
    """Submit every request at once; tokens/s and the mean step time."""
    import torch

    start = time.perf_counter()
    for i, prompt in enumerate(work):
        engine.add_request(str(i), prompt, params)
    tokens = steps = 0
    with torch.inference_mode():
        while engine.has_unfinished_requests():
            tokens += sum(len(out.new_token_ids) for out in engine.step())
            steps += 1
    wall = time.perf_counter() - start
    return {"tok_s": tokens / wall, "tokens": tokens, "step_ms": 1e3 * wall / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model and workload")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file

    from common.job_input import Structured
    from common.model_config import ModelConfig
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.params import SamplingParams
    from worker.model.weights import build_model

    torch.set_num_threads(1)
    size = "quick" if args.quick else "default"
    requests, max_tokens = (8, 32) if args.quick else (args.requests, args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model"
        params_count = make_checkpoint(ckpt, size)
        config = ModelConfig.from_hf_dict(json.loads((ckpt / "config.json").read_text()))
        tokenizer = make_tokenizer(Path(tmp) / "tokenizer.json", config.vocab_size)
        model = build_model(config, load_file(str(ckpt / "model.safetensors")))
    rng = random.Random(1)
    work = [
        [rng.randrange(2, config.vocab_size) for _ in range(rng.randint(32, 256))]
        for _ in range(requests)
    ]
    capacity = sum(len(p) + max_tokens + 16 for p in work)
    engine_config = EngineConfig(
        max_num_seqs=requests, num_kv_blocks=-(-capacity // 16), enable_prefix_caching=False
    )
    modes = {
        "free": SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        "json schema": SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=True,
            structured=Structured("json", json.dumps(SCHEMA)),
        ),
        "regex": SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, structured=Structured("regex", REGEX)
        ),
    }
    engine = LLMEngine.from_model(model, tokenizer, (), engine_config, clock=time.perf_counter)
    start = time.perf_counter()
    for params in modes.values():  # warm-up: packed weights, the grammars compiled and cached
        run(engine, work[:2], params)
    print(f"# warm-up (incl. the grammars' tokenizer) {time.perf_counter() - start:.1f} s")
    best: dict[str, dict[str, float]] = {}
    for r in range(args.rounds):
        for name, params in modes.items():
            result = run(engine, work, params)
            if name not in best or result["tok_s"] > best[name]["tok_s"]:
                best[name] = result
            print(f"# round {r + 1}: {name} {result['tok_s']:.1f} tok/s")
    print(f"# machine: {platform.machine()}, torch threads 1, python {platform.python_version()}")
    print(f"# model: random Llama, {params_count / 1e6:.1f}M parameters, vocab {config.vocab_size}")
    print(f"# workload: {requests} requests at once, {max_tokens} output tokens each")
    print(f"{'mode':<12} {'tok/s':>8} {'step ms':>8} {'tokens':>7} {'vs free':>8}")
    free = best["free"]["tok_s"]
    for name, result in best.items():
        ratio = result["tok_s"] / free
        print(f"{name:<12} {result['tok_s']:8.1f} {result['step_ms']:8.2f} "
              f"{result['tokens']:7.0f} {ratio:7.3f}x")  # fmt: skip
    cost = {name: round(1 - best[name]["tok_s"] / free, 3) for name in modes if name != "free"}
    print(json.dumps({"bench": "structured", "tok_s": {k: round(v["tok_s"], 1)
                      for k, v in best.items()}, "cost": cost}))  # fmt: skip


if __name__ == "__main__":
    main()

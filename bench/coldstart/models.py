"""The bench's two models: the demo model (`platform models create-demo`) and a 1.16 GB bf16
Llama-shaped checkpoint (`bench/loader.py`'s "small" shape: hidden 2048, 32 heads of 64, 8 KV
heads, MLP 5632, vocab 32000, 10 layers, untied head) with the demo's tokenizer.

The big checkpoint's weights are random rows repeated, so every logit ties and greedy decoding
picks a special token whose text is empty, and the worker streams no `output` event for empty
text: `lm_head` is rewritten to zero rows but two ordinary tokens (+row, -row), so the first
token is a visible one. Same bytes to stream, same compute.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.loaderbench.checkpoint import SHAPES, make_checkpoint


@dataclass(frozen=True, slots=True)
class Model:
    key: str  # "demo", "big", or "big-vllm" (the big checkpoint deployed on vLLM)
    path: Path  # the local directory
    size_bytes: int  # of model.safetensors
    engine: str = "builtin"  # the deployment's `engine`


def ascii_token_ids(tokenizer_json: Path, count: int = 2) -> list[int]:
    """The first `count` ids that decode to a plain word (text an output event will carry)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    plain = re.compile(r" ?[A-Za-z]{2,}")
    found = [i for i in range(tok.get_vocab_size()) if plain.fullmatch(tok.decode([i]))]
    if len(found) < count:
        raise ValueError(f"{tokenizer_json}: fewer than {count} plain-word tokens")
    return found[:count]


def make_head_visible(path: Path, token_ids: list[int], name: str = "lm_head.weight") -> None:
    """Rewrite `name` in place: every row 0 but row ids[0] = r and row ids[1] = -r (r: its
    first row). Greedy decoding then picks one of the two, whatever the hidden state, unless
    it is orthogonal to r."""
    import numpy as np

    with path.open("r+b") as f:
        header_len = int.from_bytes(f.read(8), "little")
        info = json.loads(f.read(header_len))[name]
    width = {"BF16": 2, "F16": 2, "F32": 4}[info["dtype"]]
    dtype = np.uint16 if width == 2 else np.uint32
    sign = 1 << (8 * width - 1)
    start, end = info["data_offsets"]
    rows = np.memmap(
        path, dtype=dtype, mode="r+", offset=8 + header_len + start, shape=tuple(info["shape"])
    )
    assert rows.nbytes == end - start
    base = np.array(rows[0])
    rows[:] = 0
    rows[token_ids[0]] = base
    rows[token_ids[1]] = base ^ dtype(sign)  # the sign bit flipped: -r
    rows.flush()
    del rows


def build_models(
    work: Path, skip_big: bool, engines: tuple[str, ...] = ("builtin",)
) -> list[Model]:
    """The demo model and (unless skipped) the big one under `work`, reused when complete; with
    vLLM among `engines`, the big one again as deployed on vLLM (the demo model's heads of 16
    are below what vLLM's CPU attention runs)."""
    models = []
    demo = work / "demo"
    if not (demo / "model.safetensors").exists():
        shutil.rmtree(demo, ignore_errors=True)
        cli = Path(sys.executable).parent / "platform"
        subprocess.run(
            [str(cli), "models", "create-demo", str(demo)],
            check=True,
            capture_output=True,
            timeout=600,
        )
    models.append(Model("demo", demo, (demo / "model.safetensors").stat().st_size))
    if skip_big:
        return models
    big, done = work / "big", work / "big" / ".complete"
    if not done.exists():
        shutil.rmtree(big, ignore_errors=True)
        make_checkpoint(big / "model.safetensors", "small", None)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (demo / name).exists():
                shutil.copy(demo / name, big / name)
        hidden, kv, mlp, vocab, layers = SHAPES["small"]
        config = json.loads((demo / "config.json").read_text())
        config.update(
            hidden_size=hidden,
            head_dim=64,
            num_attention_heads=hidden // 64,
            num_key_value_heads=kv // 64,
            intermediate_size=mlp,
            vocab_size=vocab,
            num_hidden_layers=layers,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
            max_position_embeddings=2048,
        )
        (big / "config.json").write_text(json.dumps(config, indent=2))
        make_head_visible(big / "model.safetensors", ascii_token_ids(big / "tokenizer.json"))
        done.touch()
    models.append(Model("big", big, (big / "model.safetensors").stat().st_size))
    if "vllm" in engines:
        models.append(Model("big-vllm", big, models[-1].size_bytes, engine="vllm"))
    return models

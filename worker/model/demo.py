"""A tiny Llama checkpoint in Hugging Face format, built from scratch with no network.

It trains a byte-level BPE tokenizer on ``demo_corpus.txt`` (original prose shipped with the
package), initialises a 2-layer Llama and, optionally, trains it for a few seconds on the same
corpus so that it writes English-looking text. The result loads in this engine and in
``transformers`` alike (``LlamaForCausalLM`` / ``AutoTokenizer.from_pretrained(dir)``), which
makes it the model of the demo and of the end-to-end tests.

    python -m worker.model.demo DIR [--seed N] [--train-steps N]

Files written: config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json. Deterministic for a given seed and number of training steps.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from common.model_config import ModelConfig
from worker.model.llama import LlamaModel
from worker.model.weights import hf_state_dict

CORPUS_PATH = Path(__file__).with_name("demo_corpus.txt")
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
VOCAB_SIZE = 512
MAX_POSITION_EMBEDDINGS = 512
# Default training budget: about 6 s on an idle 2-core CPU (the whole command takes ~9 s).
DEFAULT_TRAIN_STEPS = 250
# One thread: two are faster on an idle machine, but stall badly when the two cores are shared
# (tests running beside it); one is also reproducible whatever the core count.
TRAIN_THREADS = 1
_SEQ_LEN = 64
_BATCH_SIZE = 16
_LEARNING_RATE = 1e-2
_INIT_STD = 0.02

FILE_NAMES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def create_demo_model(
    out_dir: Path,
    seed: int = 0,
    train_steps: int = DEFAULT_TRAIN_STEPS,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write the demo checkpoint into ``out_dir`` (created if needed) and return it;
    ``progress`` hears each step (a line of text)."""
    if train_steps < 0:
        raise ValueError(f"train_steps: must be >= 0, got {train_steps}")
    say = progress or (lambda _: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paragraphs = load_corpus()
    say(f"training a {VOCAB_SIZE}-token tokenizer on the bundled corpus")
    tokenizer = train_tokenizer(paragraphs)
    hf_config = demo_hf_config(tokenizer)
    config = ModelConfig.from_hf_dict(hf_config)

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        generator = torch.Generator().manual_seed(seed)
        model = init_model(config, generator)
        if train_steps > 0:
            say(f"training the model: {train_steps} steps")
            stream = _token_stream(tokenizer, paragraphs)
            train(model, stream, train_steps, generator, say)
    finally:
        torch.set_num_threads(previous_threads)

    say(f"writing {', '.join(FILE_NAMES)}")
    state = hf_state_dict(model)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", hf_config)
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": config.bos_token_id, "eos_token_id": list(config.eos_token_ids)},
    )
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "model_max_length": MAX_POSITION_EMBEDDINGS,
            "clean_up_tokenization_spaces": False,
        },
    )
    return out_dir


def load_corpus() -> list[str]:
    """Paragraphs of the corpus, each unwrapped onto one line."""
    text = CORPUS_PATH.read_text(encoding="utf-8")
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def train_tokenizer(paragraphs: Sequence[str]) -> Tokenizer:
    """Byte-level BPE (every byte is a token, so any UTF-8 text round-trips); prepends bos."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(paragraphs, trainer=trainer)
    bos_id = _token_id(tokenizer, BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def demo_hf_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """config.json of the demo model, as ``LlamaConfig.save_pretrained`` would write it."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": _INIT_STD,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "bos_token_id": _token_id(tokenizer, BOS_TOKEN),
        "eos_token_id": _token_id(tokenizer, EOS_TOKEN),
    }


def init_model(config: ModelConfig, generator: torch.Generator) -> LlamaModel:
    """Random init like ``transformers``: N(0, 0.02) matrices, unit norms."""
    model = LlamaModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, _INIT_STD, generator=generator)
    return model


def train(
    model: LlamaModel,
    stream: torch.Tensor,
    steps: int,
    generator: torch.Generator,
    progress: Callable[[str], None] | None = None,
) -> float:
    """Next-token training on random windows of ``stream`` ([num_tokens]); returns last loss.
    ``progress`` hears the loss at each fifth of the steps."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=_LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 20) * max(0.1, 1 - step / steps)
    )
    loss = torch.zeros(())
    report_every = max(1, steps // 5)
    for step in range(steps):
        # starts: [batch]; windows: [batch, seq_len + 1]
        starts = torch.randint(0, len(stream) - _SEQ_LEN - 1, (_BATCH_SIZE,), generator=generator)
        windows = torch.stack([stream[s : s + _SEQ_LEN + 1] for s in starts.tolist()])
        # logits: [batch, seq_len, vocab]
        logits = model.forward_all(windows[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if progress is not None and ((step + 1) % report_every == 0 or step + 1 == steps):
            progress(f"  step {step + 1}/{steps}: loss {float(loss.detach()):.2f}")
    model.eval()
    return float(loss.detach())


def _token_stream(tokenizer: Tokenizer, paragraphs: Sequence[str]) -> torch.Tensor:
    """All paragraphs as ``<s> text </s>`` back to back: [num_tokens]."""
    eos_id = _token_id(tokenizer, EOS_TOKEN)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(list(paragraphs)):
        ids.extend([*encoding.ids, eos_id])  # the post-processor already put <s> first
    return torch.tensor(ids, dtype=torch.long)


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:  # cannot happen: the trainer adds the special tokens first
        raise RuntimeError(f"tokenizer lacks {token!r}")
    return token_id


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m worker.model.demo",
        description="Write a tiny Llama checkpoint (HF format) trained on a bundled corpus.",
        epilog="example: python -m worker.model.demo /tmp/demo-model --train-steps 250",
    )
    parser.add_argument("out_dir", type=Path, help="directory to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--train-steps",
        type=int,
        default=DEFAULT_TRAIN_STEPS,
        help=f"training steps; 0 = random weights (default: {DEFAULT_TRAIN_STEPS})",
    )
    args = parser.parse_args(argv)
    if args.train_steps < 0:
        parser.error("--train-steps must be >= 0")

    started = time.perf_counter()
    out_dir = create_demo_model(
        args.out_dir, seed=args.seed, train_steps=args.train_steps, progress=_progress
    )
    elapsed_s = time.perf_counter() - started
    print(f"wrote {', '.join(FILE_NAMES)} to {out_dir} in {elapsed_s:.1f} s")
    _print_sample(out_dir)


def _progress(line: str) -> None:
    print(line, flush=True)


def _print_sample(out_dir: Path) -> None:
    """Generate one short sample with the engine, so the checkpoint can be eyeballed."""
    from safetensors.torch import load_file

    from worker.engine.generate import Generator
    from worker.engine.sampling import SamplingParams
    from worker.model.weights import build_model

    config = ModelConfig.from_hf_dict(json.loads((out_dir / "config.json").read_text()))
    model = build_model(config, load_file(str(out_dir / "model.safetensors")))
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    generator = Generator(model, tokenizer, config.eos_token_ids, config.max_position_embeddings)
    prompt = "The weather"
    params = SamplingParams(max_tokens=60, temperature=0.7, top_p=0.9, seed=0)
    result = generator.run(prompt, params)
    print(f"sample ({result.generated_tokens} tokens, {result.finish_reason}):")
    print(f"  {prompt}{result.text}")


if __name__ == "__main__":
    main()

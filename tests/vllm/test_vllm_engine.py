"""`VllmEngine` (worker/vllm/) over tiny random checkpoints, weights through the platform's
loader: greedy tokens equal to transformers' (Gemma2, Mixtral: architectures the built-in
engine does not run) and to the built-in engine's (Llama)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.vllm.conftest import run_vllm_engine
from worker.engine.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.params import SamplingParams
from worker.runtime.loading import load_model

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 12
PROMPTS = [
    [0, 17, 42, 99, 7, 300, 12],
    [0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23],
    [0, 17, 42, 99, 7, 300, 12, 401, 2, 33],  # shares a prefix with the first
]


def hf_greedy(path: Path, prompt: list[int]) -> list[int]:
    """transformers' argmax, token by token, EOS a token like any other (`generate`'s
    `min_new_tokens` would mask it instead)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def builtin_greedy(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    loaded = load_model(path.as_uri())
    engine = LLMEngine.from_model(
        loaded.model, loaded.tokenizer, loaded.eos_token_ids, EngineConfig(max_num_seqs=4)
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    tokens: list[list[int]] = [[] for _ in prompts]
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[int(out.request_id)].extend(out.new_token_ids)
    return tokens


@pytest.fixture(scope="module")
def vllm_runs(vllm_python: Path, tiny_models: dict[str, Path]) -> dict[str, Any]:
    specs = [
        {"uri": tiny_models[k].as_uri(), "prompts": PROMPTS, "max_tokens": NEW_TOKENS}
        for k in ("llama", "gemma2", "mixtral")
    ]
    specs[0]["logprobs"] = 3
    runs = run_vllm_engine(vllm_python, specs)["models"]
    return dict(zip(("llama", "gemma2", "mixtral"), runs, strict=True))


@pytest.mark.parametrize("kind", ["gemma2", "mixtral"])
def test_vllm_runs_what_the_builtin_engine_cannot_token_for_token(
    kind: str, vllm_runs: dict[str, Any], tiny_models: dict[str, Path]
) -> None:
    run = vllm_runs[kind]
    expected = [hf_greedy(tiny_models[kind], p) for p in PROMPTS]
    assert run["tokens"] == expected
    assert run["finish"] == ["length"] * len(PROMPTS)
    # every weight byte came through the platform's loader
    size = sum(f.stat().st_size for f in tiny_models[kind].glob("*.safetensors"))
    assert 0 < run["load_bytes"] <= size


def test_vllm_and_the_builtin_engine_agree_on_llama(
    vllm_runs: dict[str, Any], tiny_models: dict[str, Path]
) -> None:
    run = vllm_runs["llama"]
    assert run["tokens"] == builtin_greedy(tiny_models["llama"], PROMPTS)
    assert run["tokens"][0] == hf_greedy(tiny_models["llama"], PROMPTS[0])
    # log-probabilities: the sampled (greedy) token is the best, with 3 alternatives
    for lps, tokens in zip(run["logprobs"], run["tokens"], strict=True):
        assert [lp[0] for lp in lps] == tokens
        for token_id, logprob, top in lps:
            assert len(top) == 3 and top[0][0] == token_id
            assert top[0][1] == pytest.approx(logprob) and logprob <= 0
    assert run["prefix_queries"] == sum(len(p) for p in PROMPTS)


def test_two_accelerators_split_the_model_and_answer_the_same(
    vllm_python: Path, tiny_models: dict[str, Path]
) -> None:
    """`accelerator_count: 2`: vLLM's tensor parallelism over two ranks (processes; on a CPU
    host, two shares of its cores), each rank's weights through the platform's loader."""
    spec = {
        "uri": tiny_models["llama"].as_uri(),
        "prompts": PROMPTS[:1],
        "max_tokens": NEW_TOKENS,
        "accelerator_count": 2,
    }
    (run,) = run_vllm_engine(vllm_python, [spec])["models"]
    assert run["tokens"] == [hf_greedy(tiny_models["llama"], PROMPTS[0])]
    # the ranks loaded in their own processes: the worker's process saw no load of its own
    assert run["load_bytes"] is None

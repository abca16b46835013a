"""Differential test: the engine against ``transformers`` on the same checkpoint.

For every supported architecture (small random-weight models written with ``save_pretrained``,
fp32) the engine must produce exactly the greedy tokens of ``transformers.generate``: each
prompt alone, all prompts batched together, with prefix caching hitting shared prompt blocks,
with chunked prefill forced by a tiny token budget, with preemption forced by a tiny KV
cache, and with later sync requests preempting running batch ones. Log-probabilities are
compared too, and the demo checkpoint end to end (tokenizer and text included).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from common.model_config import ModelConfig
from worker.engine.config import EngineConfig
from worker.engine.generate import Generator
from worker.engine.llm_engine import LLMEngine
from worker.engine.params import SamplingParams
from worker.model.demo import create_demo_model
from worker.model.llama import LlamaModel
from worker.model.weights import build_model, hf_state_dict

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 128
NEW_TOKENS = 14
BLOCK_SIZE = 4

# name -> (config class, model class, architecture-specific config)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama_gqa": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "llama_mqa_tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "llama3_rope_scaling": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "num_key_value_heads": 2,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "mistral_sliding_window": (
        "MistralConfig",
        "MistralForCausalLM",
        {"num_key_value_heads": 2, "sliding_window": 8},
    ),
    "qwen2_qkv_bias": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "qwen3_qk_norm": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"num_key_value_heads": 2, "head_dim": 32, "attention_bias": True},
    ),
}


def _prompts() -> list[list[int]]:
    """Varied lengths; the last two share full blocks with the third (prefix-cache hits)."""
    rng = torch.Generator().manual_seed(7)

    def rand(n: int) -> list[int]:
        return [int(t) for t in torch.randint(2, VOCAB_SIZE, (n,), generator=rng)]

    base = [0, *rand(39)]
    return [[0], [0, *rand(6)], base, [0, *rand(44)], base[:36] + rand(6), base + rand(3)]


PROMPTS = _prompts()


@dataclass
class Case:
    name: str
    hf_model: Any
    model: LlamaModel
    # per prompt: greedy tokens and per-step logits of transformers
    hf_tokens: list[list[int]]
    hf_logits: list[torch.Tensor]


def _save_hf_model(name: str, path: Path) -> Any:
    config_cls, model_cls, extra = ARCHITECTURES[name]
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        # larger than the default 0.02, so the top two logits are never near-ties
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=None,  # no early stop: always NEW_TOKENS tokens to compare
        pad_token_id=None,
        **extra,
    )
    torch.manual_seed(1234)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():  # biases init to 0 and norms to 1: make them matter
        for pname, param in model.named_parameters():
            if pname.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif pname.endswith("norm.weight"):
                param.normal_(1.0, 0.1)
    model.save_pretrained(path)
    return getattr(transformers, model_cls).from_pretrained(path).eval()


def _our_model(checkpoint: Path, dtype: torch.dtype | None = None) -> LlamaModel:
    config = ModelConfig.from_hf_dict(json.loads((checkpoint / "config.json").read_text()))
    return build_model(config, load_file(str(checkpoint / "model.safetensors")), dtype)


def _hf_greedy(hf_model: Any, prompt_ids: list[int]) -> tuple[list[int], torch.Tensor]:
    input_ids = torch.tensor([prompt_ids])
    out = hf_model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        output_logits=True,
        return_dict_in_generate=True,
    )
    # logits: [NEW_TOKENS, vocab]
    return out.sequences[0, len(prompt_ids) :].tolist(), torch.stack(out.logits)[:, 0]


def _id_tokenizer() -> Tokenizer:
    """Token ``t{i}`` is id i: enough for the engine to detokenize arbitrary ids."""
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB_SIZE)}, "t1"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    path = tmp_path_factory.mktemp(request.param)
    hf_model = _save_hf_model(request.param, path)
    greedy = [_hf_greedy(hf_model, p) for p in PROMPTS]
    return Case(
        request.param,
        hf_model,
        _our_model(path),
        [tokens for tokens, _ in greedy],
        [logits for _, logits in greedy],
    )


def run_engine(
    model: LlamaModel,
    prompts: Sequence[list[int]],
    config: EngineConfig,
    params: SamplingParams,
    rounds: int = 1,
    one_at_a_time: bool = False,
) -> tuple[list[list[int]], LLMEngine, list[Any]]:
    """Generate for every prompt (``rounds`` times); check the block books every step.

    Returns the tokens per request, the engine and every output (in order)."""
    engine = LLMEngine.from_model(model, _id_tokenizer(), (), config)
    tokens: dict[str, list[int]] = defaultdict(list)
    outputs = []
    order = []
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            request_id = f"{r}-{i}"
            order.append(request_id)
            engine.add_request(request_id, prompt, params)
            while engine.has_unfinished_requests() and (one_at_a_time or i == len(prompts) - 1):
                for out in engine.step():
                    tokens[out.request_id].extend(out.new_token_ids)
                    outputs.append(out)
                live = engine.scheduler.running + engine.scheduler.waiting
                engine.block_manager.check_invariants(live)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.cache.num_blocks, "blocks leaked"
    return [tokens[r] for r in order], engine, outputs


GREEDY = SamplingParams(max_tokens=NEW_TOKENS)


def _config(**kwargs: Any) -> EngineConfig:
    base: dict[str, Any] = {"block_size": BLOCK_SIZE, "max_num_seqs": 8, "num_kv_blocks": 256}
    return EngineConfig(**(base | kwargs))


def test_each_prompt_alone(case: Case) -> None:
    config = _config(max_num_seqs=1, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=NEW_TOKENS, logprobs=3)
    tokens, _, outputs = run_engine(case.model, PROMPTS, config, params, one_at_a_time=True)
    assert tokens == case.hf_tokens
    finals = [o for o in outputs if o.finished]
    assert len(finals) == len(PROMPTS) and all(f.finish_reason == "length" for f in finals)

    # log-probabilities of every generated token and of the top 3, as transformers computes
    for i in range(len(PROMPTS)):
        steps = [lp for o in outputs if o.request_id == f"0-{i}" for lp in o.logprobs or ()]
        assert len(steps) == NEW_TOKENS
        ref = torch.log_softmax(case.hf_logits[i], dim=-1)
        for j, lp in enumerate(steps):
            values, ids = torch.topk(ref[j], 3)
            assert lp.token_id == case.hf_tokens[i][j]
            assert [t for t, _ in lp.top] == ids.tolist()
            assert lp.logprob == pytest.approx(float(ref[j, lp.token_id]), abs=1e-4)
            assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)


def test_batched_with_varied_lengths(case: Case) -> None:
    config = _config(enable_prefix_caching=False)
    tokens, _, _ = run_engine(case.model, PROMPTS, config, GREEDY)
    assert tokens == case.hf_tokens


def test_prefix_caching_hits_shared_blocks(case: Case) -> None:
    tokens, engine, outputs = run_engine(case.model, PROMPTS, _config(), GREEDY, rounds=2)
    assert tokens == case.hf_tokens * 2
    stats = engine.stats().prefix_cache
    assert stats.hits > 0
    # the second round finds every full prompt block but the one holding the last token
    second = [o for o in outputs if o.finished and o.request_id.startswith("1-")]
    assert len(second) == len(PROMPTS)
    for out in second:
        expected = (out.num_prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
        assert out.num_cached_tokens == expected


def test_chunked_prefill_under_a_small_budget(case: Case) -> None:
    config = _config(max_num_batched_tokens=5)
    tokens, _, _ = run_engine(case.model, PROMPTS, config, GREEDY)
    assert tokens == case.hf_tokens


def test_preemption_under_a_tiny_cache(case: Case) -> None:
    # 64 tokens of cache: the longest request (45 + 14 tokens) fits alone, not all together
    config = _config(num_kv_blocks=16, enable_prefix_caching=case.name != "llama_gqa")
    tokens, engine, outputs = run_engine(case.model, PROMPTS, config, GREEDY)
    assert tokens == case.hf_tokens
    if engine.cache.sliding_window is not None:
        # blocks freed out of the window make room: Mistral gets by without preempting here
        # (it is preempted in test_priority_preemption_keeps_greedy_tokens)
        return
    assert engine.stats().num_preemptions > 0
    assert any(o.metrics.num_preemptions for o in outputs if o.finished)


def test_priority_preemption_keeps_greedy_tokens(case: Case) -> None:
    """Batch-class requests run first; sync ones arriving later preempt them for blocks and
    slots; everyone still gets exactly the tokens of running alone."""
    config = _config(num_kv_blocks=24, max_num_seqs=3, max_num_batched_tokens=32)
    engine = LLMEngine.from_model(case.model, _id_tokenizer(), (), config)
    plans: list[tuple[set[str], Any]] = []
    schedule = engine.scheduler.schedule

    def schedule_and_record() -> Any:
        running = {q.request_id for q in engine.scheduler.running}
        out = schedule()
        plans.append((running, out))
        return out

    engine.scheduler.schedule = schedule_and_record  # type: ignore[method-assign]
    batch, sync = [2, 3, 5], [0, 1, 4]  # long prompts first, as batch work
    tokens: dict[str, list[int]] = defaultdict(list)
    for i in batch:
        engine.add_request(str(i), PROMPTS[i], GREEDY, priority=2)
    for step in range(200):
        if step == 4:
            for i in sync:
                engine.add_request(str(i), PROMPTS[i], GREEDY, priority=0)
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
        engine.block_manager.check_invariants(engine.scheduler.running + engine.scheduler.waiting)
        if not engine.has_unfinished_requests():
            break
    assert [tokens[str(i)] for i in range(len(PROMPTS))] == case.hf_tokens
    assert engine.block_manager.num_free_blocks == engine.cache.num_blocks
    # some step admitted a sync request by preempting batch ones
    assert any(
        out.preempted
        and all(q.priority == 2 for q in out.preempted)
        and any(s.seq.priority == 0 and s.seq.request_id not in running for s in out.scheduled)
        for running, out in plans
    )


def test_bfloat16_and_float16_track_transformers(tmp_path: Path) -> None:
    """Half precision: greedy tokens agree until transformers' own top two logits are within
    rounding of each other (a near-tie either side may break)."""
    hf_fp32 = _save_hf_model("llama_gqa", tmp_path)
    prompts = PROMPTS[1:3]
    for dtype, margin in ((torch.bfloat16, 0.1), (torch.float16, 0.02)):
        hf_model = hf_fp32.to(dtype)
        model = _our_model(tmp_path, dtype)
        assert model.lm_head.weight.dtype == dtype
        tokens, _, _ = run_engine(model, prompts, _config(), GREEDY)
        for prompt, ours in zip(prompts, tokens, strict=True):
            ref, logits = _hf_greedy(hf_model, prompt)
            top2 = logits.float().topk(2, dim=-1).values
            for j, (a, b) in enumerate(zip(ours, ref, strict=True)):
                if a != b:
                    gap = float(top2[j, 0] - top2[j, 1])
                    assert gap < margin, f"{dtype}: token {j} differs with a top-2 gap of {gap}"
                    break
        hf_fp32 = hf_model.float()


def test_demo_checkpoint_matches_transformers(tmp_path: Path) -> None:
    checkpoint = create_demo_model(tmp_path / "demo", seed=3, train_steps=0)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(checkpoint).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = _our_model(checkpoint)
    config = model.config
    generator = Generator(
        model, Tokenizer.from_file(str(checkpoint / "tokenizer.json")), config.eos_token_ids, 512
    )

    prompts = ("The", "A serverless platform runs code", "Snow falls on the mountains.")
    results = generator.run_batch(list(prompts), SamplingParams(max_tokens=NEW_TOKENS))
    for prompt, result in zip(prompts, results, strict=True):
        prompt_ids = generator.encode(prompt)
        assert prompt_ids == hf_tokenizer(prompt).input_ids
        input_ids = torch.tensor([prompt_ids])
        hf_out = hf_model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=hf_tokenizer.eos_token_id,
        )
        hf_tokens = hf_out[0, len(prompt_ids) :].tolist()
        assert list(result.token_ids) == hf_tokens
        assert result.text == hf_tokenizer.decode(hf_tokens, skip_special_tokens=True)

        with torch.inference_mode():  # the dense (training) path too
            ref = hf_model(input_ids).logits[0]
            ours = model.forward_all(input_ids)[0]
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_build_model_names_bad_tensors(tmp_path: Path) -> None:
    _save_hf_model("llama_gqa", tmp_path)
    config = ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    weights = load_file(str(tmp_path / "model.safetensors"))

    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing tensors: model\.norm\.weight"):
        build_model(config, missing)
    extra = {**weights, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.9\.mlp\.up_proj"):
        build_model(config, extra)
    bad = {**weights, "lm_head.weight": torch.zeros(3, 64)}
    with pytest.raises(ValueError, match=r"mis-shaped tensors: lm_head\.weight \(3, 64\)"):
        build_model(config, bad)

    model = build_model(config, weights, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_fused_tensors_are_accepted_and_split_back(tmp_path: Path) -> None:
    _save_hf_model("qwen2_qkv_bias", tmp_path)
    config = ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    weights = load_file(str(tmp_path / "model.safetensors"))
    model = build_model(config, weights)
    # HF names out again, bit for bit
    again = hf_state_dict(model)
    assert again.keys() == weights.keys()
    assert all(torch.equal(again[k], weights[k]) for k in weights)
    save_file(again, str(tmp_path / "copy.safetensors"))

    # a loader may hand over q/k/v (or gate/up) already fused
    fused = {
        k: v
        for k, v in weights.items()
        if ".q_proj." not in k and ".k_proj." not in k and ".v_proj." not in k
    }
    for name, tensor in model.state_dict().items():
        if ".qkv_proj." in name:
            fused[name] = tensor.clone()
    rebuilt = build_model(config, fused)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(rebuilt.state_dict()[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["qwen2_qkv_bias", "llama_mqa_tied", "qwen3_qk_norm"])
def test_the_loader_streams_straight_into_fused_tensors(name: str, tmp_path: Path) -> None:
    """With `load_name_map` the loader hands over q/k/v and gate/up already fused (no copy
    after the load); the model is the one built from the HF tensors, bit for bit."""
    import loader
    from worker.model.weights import load_name_map

    _save_hf_model(name, tmp_path)
    config = ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    tensors = loader.load(str(tmp_path), name_map=load_name_map(config)).tensors
    assert not any(".q_proj." in n or ".gate_proj." in n for n in tensors)
    assert any(n.endswith("qkv_proj.weight") for n in tensors)
    if config.qkv_bias:
        assert any(n.endswith("qkv_proj.bias") for n in tensors)
    want = _our_model(tmp_path).state_dict()
    got = build_model(config, tensors).state_dict()
    assert got.keys() == want.keys()
    for n, t in want.items():
        assert torch.equal(got[n], t), n

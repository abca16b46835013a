"""The engine around the scheduler: streaming outputs, finish reasons, stop strings and tokens,
abort, timings, validation before allocation (with a scripted fake runner, no torch); and
seeded sampling that does not depend on the batch (on the demo model)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from worker.engine.config import CacheSpec, EngineConfig
from worker.engine.errors import PromptTooLongError
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput, SampleResult
from worker.engine.params import SamplingParams
from worker.engine.scheduler import SchedulerOutput

WORDS = ["<s>", "</s>", "Hello", " world", "!", "E", "N", "D", " more", "é"]
BOS, EOS = 0, 1


def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, "Hello"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # unused: we pass ids
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    return tokenizer


class ScriptedRunner:
    """Samples ``script(request_id, index)``: the index-th generated token of a request."""

    def __init__(self, script: Callable[[str, int], int]) -> None:
        self.script = script
        self.released: list[str] = []
        self.steps: list[SchedulerOutput] = []

    def execute(self, out: SchedulerOutput) -> list[SampleResult]:
        self.steps.append(out)
        return [
            SampleResult(self.script(s.seq.request_id, s.seq.num_output_tokens))
            for s in out.scheduled
            if s.samples
        ]

    def release(self, request_id: str) -> None:
        self.released.append(request_id)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def _engine(
    script: Callable[[str, int], int],
    num_blocks: int = 32,
    max_model_len: int = 64,
    **config: Any,
) -> tuple[LLMEngine, ScriptedRunner]:
    runner = ScriptedRunner(script)
    engine = LLMEngine(
        runner,
        _tokenizer(),
        CacheSpec(num_blocks=num_blocks, block_size=4, max_model_len=max_model_len),
        EngineConfig(block_size=4, **config),
        vocab_size=len(WORDS),
        eos_token_ids={EOS},
        bos_token_id=BOS,
        clock=Clock(),
    )
    return engine, runner


def _drain(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
        engine.block_manager.check_invariants(engine.scheduler.running + engine.scheduler.waiting)
    assert engine.block_manager.num_free_blocks == engine.cache.num_blocks
    return outs


def _text(outs: list[RequestOutput]) -> str:
    return "".join(o.text_delta for o in outs)


def test_streams_one_output_per_token_with_counts_and_timings() -> None:
    engine, runner = _engine(lambda rid, i: [2, 3, 4][i % 3])
    engine.add_request("a", [BOS, 2, 3, 3, 3, 3], SamplingParams(max_tokens=5))
    outs = _drain(engine)["a"]
    assert [o.new_token_ids for o in outs] == [(2,), (3,), (4,), (2,), (3,)]
    assert _text(outs) == "Hello world!Hello world"
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason == "length"
    assert [o.num_generated_tokens for o in outs] == [1, 2, 3, 4, 5]
    assert all(o.num_prompt_tokens == 6 and o.num_cached_tokens == 0 for o in outs)
    metrics = outs[-1].metrics
    assert metrics is not None and all(o.metrics is None for o in outs[:-1])
    # fake clock: +0.5 s per reading; arrival, then per step one reading before and one after
    assert metrics.queue_s == pytest.approx(0.5)
    assert metrics.ttft_s == pytest.approx(1.0)
    assert metrics.inter_token_latencies_s == pytest.approx((1.0,) * 4)
    assert metrics.to_dict()["itl_mean_s"] == pytest.approx(1.0)
    assert runner.released == ["a"]


def test_eos_stops_unless_ignored_and_stop_token_ids_stop_too() -> None:
    engine, _ = _engine(lambda rid, i: EOS if i == 2 else 5 if rid == "ids" and i == 1 else 2)
    engine.add_request("eos", [BOS], SamplingParams(max_tokens=8))
    engine.add_request("ignore", [BOS], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.add_request("ids", [BOS], SamplingParams(max_tokens=8, stop_token_ids=(5,)))
    outs = _drain(engine)
    assert [o.new_token_ids[0] for o in outs["eos"]] == [2, 2, EOS]
    assert (outs["eos"][-1].finish_reason, _text(outs["eos"])) == ("stop", "HelloHello")
    assert outs["ignore"][-1].finish_reason == "length"
    assert outs["ignore"][-1].num_generated_tokens == 4
    # a stop token's text is never shown
    assert (outs["ids"][-1].finish_reason, _text(outs["ids"])) == ("stop", "Hello")
    assert outs["ids"][-1].num_generated_tokens == 2


def test_stop_string_across_tokens_is_cut_and_held_text_flushed() -> None:
    tokens = [2, 5, 6, 3, 5, 6, 7, 8]  # Hello E N world E N D more
    engine, _ = _engine(lambda rid, i: tokens[i])
    engine.add_request("a", [BOS], SamplingParams(max_tokens=8, stop=("END",)))
    engine.add_request("b", [BOS], SamplingParams(max_tokens=3, stop=("ENX",)))
    outs = _drain(engine)
    deltas = [o.text_delta for o in outs["a"]]
    assert deltas == ["Hello", "", "", "EN world", "", "", ""]
    assert outs["a"][-1].finish_reason == "stop"
    # b ends by length while "EN" is held back as a possible stop: it is flushed at the end
    assert (_text(outs["b"]), outs["b"][-1].finish_reason) == ("HelloEN", "length")


def test_abort_frees_blocks_at_once_and_reports_abort() -> None:
    engine, runner = _engine(lambda rid, i: 2, max_num_seqs=1)
    engine.add_request("running", [BOS, 2, 2, 2, 2, 2], SamplingParams(max_tokens=20))
    engine.add_request("waiting", [BOS, 3], SamplingParams(max_tokens=20))
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks < 32
    final = engine.abort_request("running")
    assert final is not None and final.finished and final.finish_reason == "abort"
    assert final.new_token_ids == () and final.num_generated_tokens == 2
    assert engine.block_manager.num_free_blocks == 32  # nothing else holds blocks
    final = engine.abort_request("waiting")
    assert final is not None and final.finish_reason == "abort"
    assert final.metrics is not None and final.metrics.ttft_s is None
    assert engine.abort_request("waiting") is None  # unknown by now
    assert not engine.has_unfinished_requests()
    assert runner.released == ["running", "waiting"]
    engine.block_manager.check_invariants([])


def test_bad_requests_fail_before_anything_is_allocated() -> None:
    engine, runner = _engine(lambda rid, i: 2, num_blocks=8, max_model_len=64)
    ok = SamplingParams(max_tokens=4)
    with pytest.raises(ValueError, match=r"^prompt: must contain at least one token"):
        engine.add_request("a", [], ok)
    with pytest.raises(PromptTooLongError) as info:
        engine.add_request("a", [2] * 60, SamplingParams(max_tokens=5))
    assert (info.value.prompt_tokens, info.value.max_tokens, info.value.limit) == (60, 5, 64)
    assert "60 prompt tokens + max_tokens 5 exceeds the context window of 64" in str(info.value)
    with pytest.raises(PromptTooLongError, match="exceeds the KV cache of 32 tokens"):
        engine.add_request("a", [2] * 30, SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match=r"prompt: token ids must be in \[0, 10\)"):
        engine.add_request("a", [2, 10], ok)
    with pytest.raises(ValueError, match="stop_token_ids"):
        engine.add_request("a", [2], SamplingParams(max_tokens=4, stop_token_ids=(99,)))
    engine.add_request("a", [2], ok)
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("a", [2], ok)
    assert engine.num_unfinished_requests == 1
    assert engine.block_manager.num_free_blocks == 8  # nothing allocated before a step
    assert runner.steps == []


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match=r"^block_size: must be >= 1"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match=r"^kv_cache_memory_fraction"):
        EngineConfig(kv_cache_memory_fraction=1.5)
    with pytest.raises(ValueError, match=r"^attention_backend"):
        EngineConfig(attention_backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without chunked prefill"):
        _engine(lambda rid, i: 2, enable_chunked_prefill=False, max_num_batched_tokens=16)


def test_priority_is_served_first() -> None:
    engine, runner = _engine(lambda rid, i: 2, max_num_seqs=1)
    engine.add_request("batch", [BOS], SamplingParams(max_tokens=1), priority=6)
    engine.add_request("sync", [BOS], SamplingParams(max_tokens=1), priority=0)
    _drain(engine)
    order = [s.seq.request_id for step in runner.steps for s in step.scheduled]
    assert order == ["sync", "batch"]


def test_a_sync_request_preempts_batch_work_and_everyone_finishes() -> None:
    engine, runner = _engine(lambda rid, i: 2, num_blocks=8, max_num_seqs=2)
    engine.add_request("batch-1", [BOS, 2, 3, 3, 3], SamplingParams(max_tokens=8), priority=2)
    engine.add_request("batch-2", [BOS, 3, 3, 3, 3], SamplingParams(max_tokens=8), priority=2)
    engine.step()
    engine.step()
    engine.add_request("sync", [BOS, 4], SamplingParams(max_tokens=2), priority=0)
    outs = _drain(engine)
    # the next step preempted the latest batch request for a slot and admitted the sync one
    step = runner.steps[2]
    assert [q.request_id for q in step.preempted] == ["batch-2"]
    assert [s.seq.request_id for s in step.scheduled] == ["sync", "batch-1"]
    assert engine.stats().num_preemptions == 1
    finals = {rid: o[-1] for rid, o in outs.items()}
    assert all(f.finish_reason == "length" for f in finals.values())
    preemptions = {rid: f.metrics.num_preemptions for rid, f in finals.items() if f.metrics}
    assert preemptions == {"sync": 0, "batch-1": 0, "batch-2": 1}
    # the victim's recompute streams nothing twice: 2 tokens before it, 6 after
    assert finals["batch-2"].num_generated_tokens == 8
    assert sum(len(o.new_token_ids) for o in outs["batch-2"]) == 6


def test_encode_adds_bos_once() -> None:
    engine, _ = _engine(lambda rid, i: 2)
    assert engine.encode("") == [BOS]


# on the demo model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_engine_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Tokenizer]:
    from safetensors.torch import load_file

    from common.model_config import ModelConfig
    from worker.model.demo import create_demo_model
    from worker.model.weights import build_model

    checkpoint = create_demo_model(tmp_path_factory.mktemp("demo"), seed=0, train_steps=0)
    config = ModelConfig.from_hf_dict(json.loads((checkpoint / "config.json").read_text()))
    model = build_model(config, load_file(str(checkpoint / "model.safetensors")))
    return model, Tokenizer.from_file(str(checkpoint / Path("tokenizer.json")))


def test_seeded_sampling_does_not_depend_on_the_batch(demo_engine_parts: Any) -> None:
    model, tokenizer = demo_engine_parts
    params = SamplingParams(
        max_tokens=12, temperature=0.9, top_k=50, top_p=0.95, min_p=0.01, seed=11,
        repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2,
    )  # fmt: skip

    def run(others: int) -> list[int]:
        engine = LLMEngine.from_model(model, tokenizer, (), EngineConfig(block_size=16))
        engine.add_request("x", engine.encode("The river"), params)
        for i in range(others):
            other = SamplingParams(max_tokens=5 + i, temperature=1.0, seed=i)
            engine.add_request(f"o{i}", engine.encode("Other text " * (i + 1)), other)
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == "x":
                    tokens.extend(out.new_token_ids)
        return tokens

    alone = run(0)
    assert len(alone) == 12
    assert run(3) == alone
    assert run(6) == alone

"""Structured outputs through the engine on the demo model (random weights: nonsense, but
every constrained output parses and validates): a JSON schema with nested objects, enums and
arrays, a regex, a grammar and choices, greedy and sampled, beside free requests in one batch;
a grammar that cannot compile is refused before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from common.job_input import Structured
from common.model_config import ModelConfig
from worker.engine.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.params import SamplingParams
from worker.engine.sampling import sample_batch
from worker.model.demo import create_demo_model
from worker.model.weights import build_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "home": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "ok", "tags", "home"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Tokenizer]:
    checkpoint = create_demo_model(tmp_path_factory.mktemp("demo"), seed=0, train_steps=0)
    config = ModelConfig.from_hf_dict(json.loads((checkpoint / "config.json").read_text()))
    model = build_model(config, load_file(str(checkpoint / "model.safetensors")))
    return model, Tokenizer.from_file(str(checkpoint / Path("tokenizer.json")))


def _run(parts: tuple[Any, Tokenizer], requests: dict[str, SamplingParams]) -> dict[str, Any]:
    model, tokenizer = parts
    engine = LLMEngine.from_model(model, tokenizer, (), EngineConfig(block_size=16))
    for rid, params in requests.items():
        engine.add_request(rid, engine.encode("Describe a pet:"), params)
    texts = {rid: "" for rid in requests}
    finish = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.request_id] += out.text_delta
            if out.finished:
                finish[out.request_id] = out.finish_reason
    return {rid: (texts[rid], finish[rid]) for rid in requests}


def test_constrained_outputs_parse_and_validate(parts: tuple[Any, Tokenizer]) -> None:
    def guided(kind: str, value: str, max_tokens: int = 40, seed: int = 0) -> SamplingParams:
        spec = Structured(kind, value)
        return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, structured=spec)

    schema = json.dumps(SCHEMA)
    requests = {
        "greedy": SamplingParams(max_tokens=200, structured=Structured("json", schema)),
        **{f"s{i}": guided("json", schema, max_tokens=200, seed=i) for i in range(4)},
        "object": guided("json", '{"type": "object", "maxProperties": 0}', seed=9),
        "regex": guided("regex", r"[a-z]{2,6}-[0-9]{3}", seed=3),
        "choice": guided("choice", '["yes", "no", "maybe"]', seed=4),
        "lark": guided("grammar", 'start: "(" num ("+" num)* ")"\nnum: /[0-9]{1,2}/\n', seed=6),
        "ebnf": guided("grammar", 'root ::= "<" [a-c] ("," [a-c])* ">"', seed=7),
        "free": SamplingParams(max_tokens=30, temperature=1.0, seed=5),
    }
    out = _run(parts, requests)
    for rid in ("greedy", "s0", "s1", "s2", "s3"):
        text, finish = out[rid]
        assert finish == "stop", (rid, text)
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise AssertionError(f"{rid}: {text!r}") from exc
        jsonschema.validate(document, SCHEMA)
    assert json.loads(out["object"][0]) == {}
    assert re.fullmatch(r"[a-z]{2,6}-[0-9]{3}", out["regex"][0]), out["regex"]
    assert out["choice"][0] in ("yes", "no", "maybe")
    assert re.fullmatch(r"\(\d{1,2}(\+\d{1,2})*\)", out["lark"][0]), out["lark"]
    assert re.fullmatch(r"<[a-c](,[a-c])*>", out["ebnf"][0]), out["ebnf"]
    # the free request in the same batch is not constrained by the others' masks
    assert len(out["free"][0]) > 0


@pytest.mark.parametrize(
    "spec",
    [
        Structured("regex", "[a-"),
        Structured("grammar", "start: nothing_defined"),
        Structured("json", '{"type": "no-such-type"}'),
    ],
)
def test_a_grammar_that_cannot_compile_is_refused(
    parts: tuple[Any, Tokenizer], spec: Structured
) -> None:
    model, tokenizer = parts
    engine = LLMEngine.from_model(model, tokenizer, (), EngineConfig(block_size=16))
    with pytest.raises(ValueError, match=r"^structured: "):
        engine.add_request("x", engine.encode("hi"), SamplingParams(structured=spec))
    assert not engine.has_unfinished_requests()


def test_the_mask_is_applied_before_anything_else() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0, 3.0], [5.0, 1.0, 0.0, 3.0]])
    only = ~torch.tensor([False, False, True, True])
    params = [SamplingParams(), SamplingParams(logprobs=1)]
    results = sample_batch(logits.clone(), params, [None, None], [[0], [0]], [1, 1], [only, None])
    assert [r.token_id for r in results] == [3, 0]

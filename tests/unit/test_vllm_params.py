"""The built-in engine's sampling parameters in vLLM's terms, and vLLM's log-probabilities in
ours (worker/vllm/params.py: pure, no vLLM import)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from common.job_input import Structured
from worker.engine.outputs import TokenLogprobs
from worker.engine.params import SamplingParams
from worker.vllm.params import finish_reason, sampling_kwargs, structured_kwargs, token_logprobs


def test_every_sampling_parameter_reaches_vllm_by_its_own_name() -> None:
    p = SamplingParams(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.2,
        frequency_penalty=0.3,
        logit_bias=((5, -100.0), (9, 2.0)),
        seed=11,
        stop=("\n\n",),
        stop_token_ids=(3,),
        ignore_eos=True,
        logprobs=2,
    )
    assert sampling_kwargs(p) == {
        "n": 1,
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.3,
        "seed": 11,
        "stop_token_ids": [3],
        "ignore_eos": True,
        "logprobs": 2,
        "logit_bias": {5: -100.0, 9: 2.0},
    }
    # none of them: vLLM's own defaults for the empty ones
    plain = sampling_kwargs(SamplingParams())
    assert "stop" not in plain  # matched by VllmEngine in its own text
    assert plain["logit_bias"] is None and plain["logprobs"] is None
    assert "structured_outputs" not in plain


def test_structured_outputs_keep_their_kind() -> None:
    p = SamplingParams(structured=Structured("json", '{"type": "object"}'))
    assert sampling_kwargs(p)["structured_outputs"] == {"json": {"type": "object"}}
    assert structured_kwargs("choice", '["a", "b"]') == {"choice": ["a", "b"]}
    assert structured_kwargs("regex", "[0-9]+") == {"regex": "[0-9]+"}
    assert structured_kwargs("grammar", "start: 'x'") == {"grammar": "start: 'x'"}
    with pytest.raises(ValueError, match="unknown kind"):
        structured_kwargs("xml", "<a/>")


@dataclass
class _Logprob:
    logprob: float
    rank: int | None


def test_logprobs_take_the_best_alternatives_in_rank_order() -> None:
    # the sampled token (7) was ranked 3rd: it is in the map beside the top 2
    positions = [{7: _Logprob(-2.0, 3), 4: _Logprob(-0.5, 1), 8: _Logprob(-1.0, 2)}]
    assert token_logprobs([7], positions, 2) == (TokenLogprobs(7, -2.0, ((4, -0.5), (8, -1.0))),)
    assert token_logprobs([4], [{4: _Logprob(-0.1, 1)}], 0) == (TokenLogprobs(4, -0.1, ()),)


def test_finish_reasons_map_to_ours() -> None:
    assert [finish_reason(r) for r in ("stop", "length", "abort", None)] == [
        "stop",
        "length",
        "abort",
        "stop",
    ]

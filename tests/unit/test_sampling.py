"""Token choice from logits: greedy, seeded sampling, top-k/top-p/min-p, penalties (as
transformers and OpenAI define them), batched sampling, logprobs, and parameter validation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from common.job_input import DEFAULT_TEMPERATURE, JobInput
from worker.engine.sampling import (
    SamplingParams,
    apply_penalties,
    request_generator,
    sample,
    sample_batch,
)


def _draws(logits: torch.Tensor, params: SamplingParams, n: int) -> list[int]:
    generator = torch.Generator().manual_seed(params.seed or 0)
    return [sample(logits, params, generator) for _ in range(n)]


def test_greedy_is_argmax() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    assert sample(logits, SamplingParams(), None) == int(logits.argmax())
    assert sample(logits[None], SamplingParams(), None) == int(logits.argmax())  # [1, vocab]
    # ties go to the first index, as in transformers (torch.argmax)
    assert sample(torch.tensor([0.0, 3.0, 3.0, 1.0]), SamplingParams(), None) == 1


def test_seeded_sampling_is_reproducible() -> None:
    logits = torch.zeros(100)  # uniform: many distinct outcomes
    params = SamplingParams(temperature=1.0, seed=42)
    first = _draws(logits, params, 30)
    assert first == _draws(logits, params, 30)
    assert len(set(first)) > 5
    assert first != _draws(logits, SamplingParams(temperature=1.0, seed=43), 30)


def test_temperature_sharpens() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0])
    cold = _draws(logits, SamplingParams(temperature=0.05, seed=1), 200)
    hot = _draws(logits, SamplingParams(temperature=5.0, seed=1), 200)
    assert set(cold) == {0}
    assert set(hot) == {0, 1, 2}


def test_top_p_restricts_support() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert set(_draws(logits, SamplingParams(temperature=1.0, seed=3), 400)) == {0, 1, 2, 3}
    # 0.5 + 0.3 + 0.15 = 0.95 covers top_p 0.9: the 0.05 token is never drawn
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_p=0.9, seed=3), 400)) == {
        0,
        1,
        2,
    }
    # the most likely token alone holds 0.5 >= 0.4
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_p=0.4, seed=3), 100)) == {0}
    # the most likely token is always kept, however small top_p is
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_p=1e-6, seed=3), 50)) == {0}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"seed": "7"}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"stop": "END"}, "stop"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_invalid_params_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        SamplingParams(**kwargs)


def test_error_states_the_allowed_range() -> None:
    with pytest.raises(ValueError, match=r">= 1"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match=r">= 0"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        SamplingParams(top_p=2.0)


def test_stop_list_becomes_tuple() -> None:
    params = SamplingParams(stop=["\n", "END"])  # type: ignore[arg-type]
    assert params.stop == ("\n", "END")


def test_top_k_and_min_p_restrict_support() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_k=2, seed=3), 300)) == {0, 1}
    # min_p 0.2: tokens below 0.2 * 0.5 = 0.1 are dropped
    assert set(_draws(logits, SamplingParams(temperature=1.0, min_p=0.2, seed=3), 300)) == {
        0,
        1,
        2,
    }
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_k=1, seed=3), 50)) == {0}


def test_repetition_penalty_matches_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(32, generator=torch.Generator().manual_seed(1))
    prompt, output = [3, 5, 5], [7, 3]
    ours = apply_penalties(logits, SamplingParams(repetition_penalty=1.3), prompt, output)
    processor = transformers.RepetitionPenaltyLogitsProcessor(penalty=1.3)
    ref = processor(torch.tensor([prompt + output]), logits[None].clone())[0]
    torch.testing.assert_close(ours, ref)


def test_presence_and_frequency_penalties_count_output_tokens_only() -> None:
    logits = torch.zeros(6)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, params, prompt_ids=[1, 1, 1], output_ids=[2, 2, 3])
    assert out.tolist() == [0.0, 0.0, -1.0, -0.75, 0.0, 0.0]
    # greedy follows the penalised logits
    assert (
        sample(torch.tensor([2.0, 1.9]), SamplingParams(presence_penalty=0.5), None, [], [0]) == 1
    )


def test_sample_batch_draws_per_request_whatever_the_batch() -> None:
    vocab = 50
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(),  # greedy
        SamplingParams(temperature=1.0, seed=5),
        SamplingParams(temperature=0.7, top_p=0.9, seed=6),
        SamplingParams(repetition_penalty=2.0),  # greedy with a penalty
    ]
    history = [[1, 2], [3], [4, 5, 6], [int(logits[3].argmax()), 9]]

    def draw(rows: list[int]) -> list[int]:
        gens = [request_generator(params[i], torch.device("cpu")) for i in rows]
        return [
            r.token_id
            for r in sample_batch(
                logits[rows], [params[i] for i in rows], gens, [history[i] for i in rows],
                [1 for _ in rows],
            )
        ]  # fmt: skip

    together = draw([0, 1, 2, 3])
    assert together[0] == int(logits[0].argmax())
    assert together[3] != int(logits[3].argmax())  # the penalty moved greedy off the repeat
    assert draw([2, 1]) == [together[2], together[1]]
    assert draw([1]) == [together[1]]


def test_logprobs_of_the_sampled_token_and_the_top_alternatives() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    (result,) = sample_batch(logits, [SamplingParams(logprobs=2)], [None], [[0]], [1])
    ref = torch.log_softmax(logits[0], dim=-1)
    assert result.token_id == 0 and result.logprobs is not None
    assert result.logprobs.logprob == pytest.approx(float(ref[0]))
    assert [t for t, _ in result.logprobs.top] == [0, 1]
    assert [v for _, v in result.logprobs.top] == pytest.approx(ref[:2].tolist())


def test_params_from_job_input() -> None:
    job_input = JobInput.from_dict({"prompt": "hi", "max_tokens": 5, "stop": "END", "seed": None})
    params = SamplingParams.from_job_input(job_input)
    assert (params.max_tokens, params.stop, params.seed, params.temperature) == (
        5,
        ("END",),
        None,
        DEFAULT_TEMPERATURE,
    )
    # the job's defaults are the engine's: a job that sets nothing samples as the engine would
    assert SamplingParams.from_job_input(JobInput("hi")) == SamplingParams()
    with pytest.raises(ValueError, match=r"^max_tokens: must be an integer"):
        JobInput.from_dict({"prompt": "hi", "max_tokens": "5"})
    with pytest.raises(ValueError, match=r"^max_tokens: must be >= 1"):
        SamplingParams.from_job_input(JobInput("hi", max_tokens=0))


def test_logit_bias_bans_and_forces_tokens_before_anything_else() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    banned = SamplingParams(logit_bias=((0, -100.0),))
    forced = SamplingParams(logit_bias=((3, 100.0),), logprobs=1)
    results = sample_batch(logits.repeat(2, 1), [banned, forced], [None, None], [[0], [0]], [1, 1])
    assert [r.token_id for r in results] == [1, 3]
    # the log-probabilities are of the biased logits (what was sampled from)
    ref = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0, 100.0]), dim=-1)
    assert results[1].logprobs is not None
    assert results[1].logprobs.logprob == pytest.approx(float(ref[3]))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((1, 101.0),))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((-1, 1.0),))


def test_every_job_input_field_reaches_the_engine() -> None:
    job_input = JobInput(
        "hi", top_k=3, min_p=0.2, repetition_penalty=1.3, presence_penalty=0.4,
        frequency_penalty=0.6, logit_bias=((5, 1.0),), stop_token_ids=(7,), logprobs=2, seed=9,
    )  # fmt: skip
    params = SamplingParams.from_job_input(job_input)
    names = "top_k min_p repetition_penalty presence_penalty frequency_penalty logit_bias"
    for name in [*names.split(), "stop_token_ids", "logprobs", "seed"]:
        assert getattr(params, name) == getattr(job_input, name), name

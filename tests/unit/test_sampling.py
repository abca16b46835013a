"""Token choice from logits: greedy, seeded sampling, top-p, and parameter validation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from worker.engine.sampling import SamplingParams, sample


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

"""The greedy screen of the LM head (worker/model/greedy_head.py, csrc/greedy_head.c): every
token it decides is the float32 head's first maximum, on weights and hidden states of many
scales, vocabularies and widths that are not multiples of the kernel's blocks, one and two
threads; exact and near ties, non-finite values and too many candidates are left undecided
(None), never guessed; the model runner gives the same tokens with and without it, greedy
rows beside sampled, logprob and banned ones. The engine's differential tests against
transformers run through it too (after a runner's first step)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch
import torch.nn.functional as F

from tests.unit.hf_reference import _config, _id_tokenizer, _our_model, _save_hf_model

# one and two intra-op threads (the kernel splits its rows on torch's OpenMP threads)
from tests.unit.test_native_ops import threads  # noqa: F401
from worker.engine.llm_engine import LLMEngine
from worker.engine.params import SamplingParams
from worker.model import greedy_head
from worker.model.greedy_head import GreedyHead
from worker.model.packed_linear import PackedLinear
from worker.model.runner import ModelRunner

pytestmark = pytest.mark.skipif(
    not greedy_head.hardware_bf16(), reason="the screen is built only on CPUs with bfloat16 units"
)


def _head(weight: torch.Tensor) -> GreedyHead:
    head = GreedyHead.build(weight)
    assert head is not None, "this machine has bfloat16 units and a C compiler"
    return head


def _float32_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> list[int | None]:
    """The full head's first maximum as the runner computes it (oneDNN on the packed weight)
    and as torch's F.linear does; None where the two orders of summation disagree (a tie
    within float32 rounding: the screen must leave such a row undecided)."""
    onednn = PackedLinear(weight)(hidden)
    plain = F.linear(hidden, weight)
    first = onednn.max(dim=-1).indices.tolist()
    other = plain.max(dim=-1).indices.tolist()
    return [a if a == b else None for a, b in zip(first, other, strict=True)]


@pytest.mark.parametrize(
    ("vocab", "k", "w_scale", "h_scale"),
    [(32000, 512, 0.02, 1.0), (1000, 64, 1.0, 0.01), (4099, 80, 0.1, 30.0), (300, 37, 3.0, 3.0)],
)
@pytest.mark.usefixtures("threads")
def test_decided_tokens_are_the_float32_maximum(
    vocab: int, k: int, w_scale: float, h_scale: float
) -> None:
    gen = torch.Generator().manual_seed(vocab + k)
    weight = torch.randn(vocab, k, generator=gen) * w_scale
    # rows of different norms, a few with outliers (a trained model's hidden states have some)
    hidden = torch.randn(96, k, generator=gen) * h_scale
    hidden *= torch.rand(96, 1, generator=gen) * 4
    hidden[::7, 0] *= 100
    head = _head(weight)
    got = head.argmax(hidden)
    want = _float32_argmax(hidden, weight)
    decided = [(g, w) for g, w in zip(got, want, strict=True) if g is not None]
    # a decided token is the maximum under both orders of summation
    assert all(g == w for g, w in decided)
    # the screen is worth having: nearly every row is decided
    assert len(decided) >= 0.9 * len(want)


def test_cancelling_products_are_screened_by_their_magnitude_not_their_sum() -> None:
    # logits that are small sums of large products: bfloat16 gets them wrong by more than the
    # gaps between them (the screen must keep every token), float32 orders them
    right = decided = 0
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(900, 64, generator=gen) * 10
        signal = torch.randn(900, 1, generator=gen) * 0.5
        weight = noise - noise.mean(dim=1, keepdim=True) + signal / 64
        hidden = torch.ones(1, 64)
        got = _head(weight).argmax(hidden)[0]
        want = _float32_argmax(hidden, weight)[0]
        bf16_guess = int((hidden.bfloat16() @ weight.bfloat16().t()).float().argmax())
        right += bf16_guess == want
        if got is not None:
            decided += 1
            assert got == want
    assert right < 15, "the case must be one bfloat16 alone gets wrong"
    assert decided >= 15


@pytest.mark.usefixtures("threads")
def test_an_exact_tie_is_left_to_the_full_head() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(5000, 64, generator=gen)
    weight[4321] = weight[17]
    hidden = weight[17:18] * 3  # tokens 17 and 4321 share the top logit exactly
    assert _float32_argmax(hidden, weight) == [17]
    assert _head(weight).argmax(hidden) == [None]


def test_a_near_tie_below_float32_rounding_is_left_undecided() -> None:
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(2048, 128, generator=gen)
    hidden = weight[5:6].clone()
    # token 900 is token 5 with one weight nudged: logits a few units in the last place apart,
    # closer than two float32 sums of 128 terms can be ordered
    weight[900] = weight[5]
    weight[900, 3] += 4e-6 / float(hidden[0, 3])
    assert _head(weight).argmax(hidden) == [None]
    # a clear gap is decided
    weight[900, 3] += 1.0 / float(hidden[0, 3])
    assert _head(weight).argmax(hidden) == _float32_argmax(hidden, weight)


def test_non_finite_rows_and_crowds_of_candidates_are_undecided() -> None:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(3000, 32, generator=gen)
    hidden = torch.randn(4, 32, generator=gen)
    hidden[1, 5] = float("nan")
    hidden[2, 0] = float("inf")
    got = _head(weight).argmax(hidden)
    assert got[1] is None and got[2] is None
    assert got[0] == _float32_argmax(hidden[:1], weight)[0]
    # every token within bfloat16 rounding of the top: more candidates than a row may have
    crowd = torch.ones(greedy_head.MAX_CANDIDATES + 500, 32)
    crowd += torch.randn(crowd.shape, generator=gen) * 1e-4
    assert _head(crowd).argmax(torch.ones(1, 32)) == [None]


def test_bounds_grow_with_the_row_and_refuse_impossible_widths() -> None:
    small, large = greedy_head.bounds(64), greedy_head.bounds(8192)
    assert all(0 < a < b for a, b in zip(small, large, strict=True) if a != small[1])
    assert small[1] == large[1]  # the output rounding term does not depend on the width
    with pytest.raises(ValueError, match="too large"):
        greedy_head.bounds(2**24)


def test_build_declines_what_it_cannot_speed_up() -> None:
    assert GreedyHead.build(torch.randn(10, 8, dtype=torch.bfloat16)) is None
    assert GreedyHead.build(torch.randn(10)) is None


@pytest.mark.parametrize("architecture", ["llama_gqa", "llama_mqa_tied"])
def test_runner_tokens_are_the_same_with_and_without_the_screen(
    architecture: str, tmp_path: Path
) -> None:
    _save_hf_model(architecture, tmp_path)
    model = _our_model(tmp_path)
    requests = {
        "greedy-a": SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        "greedy-b": SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
        "seeded": SamplingParams(max_tokens=10, temperature=0.9, seed=5, ignore_eos=True),
        "logprobs": SamplingParams(max_tokens=8, temperature=0.0, logprobs=2, ignore_eos=True),
        "penalty": SamplingParams(
            max_tokens=8, temperature=0.0, repetition_penalty=1.3, ignore_eos=True
        ),
    }

    def run(screen: bool) -> tuple[dict[str, list[int]], int]:
        engine = LLMEngine.from_model(model, _id_tokenizer(), (), _config())
        for i, (request_id, params) in enumerate(requests.items()):
            engine.add_request(request_id, [3 + i, 17, 29, 5 * i + 1], params)
        tokens: dict[str, list[int]] = {r: [] for r in requests}
        screened = 0
        runner = cast(ModelRunner, engine.runner)
        while engine.has_unfinished_requests():
            if not screen:
                runner.greedy_head = None
            screened += runner.greedy_head is not None
            for out in engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
        return tokens, screened

    with_screen, screened_steps = run(True)
    without, _ = run(False)
    assert screened_steps > 0
    assert with_screen == without

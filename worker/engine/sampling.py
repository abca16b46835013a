"""Choosing next tokens from logits: penalties, temperature, top-k, top-p, min-p, seeded draws.

``SamplingParams`` lives in ``worker.engine.params`` (pure); it is re-exported here.

Each request draws from its own ``torch.Generator``, one draw per generated token, so a seeded
request samples the same tokens whatever else shares its batch. Greedy rows without penalties
are one batched argmax.

Example:

    >>> params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=7)
    >>> gen = request_generator(params, torch.device("cpu"))
    >>> token_id = sample(logits, params, gen)  # logits: [vocab]
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from worker.engine.outputs import SampleResult, TokenLogprobs
from worker.engine.params import SamplingParams

__all__ = [
    "SampleResult",
    "SamplingParams",
    "is_plain_greedy",
    "request_generator",
    "sample",
    "sample_batch",
]


def request_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's own random generator (None for greedy), so requests never share state."""
    if params.is_greedy:
        return None
    seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(63)
    # any int is a valid seed (negative, huge); torch takes [0, 2**64)
    return torch.Generator(device=device).manual_seed(seed % 2**64)


def apply_penalties(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> torch.Tensor:
    """Logit bias, then repetition (prompt + output, as transformers), presence and frequency
    (output only, as OpenAI) penalties on one row. logits: [vocab] float32; returns a new
    tensor."""
    device = logits.device
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long, device=device)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=logits.dtype, device=device)
        logits = logits.index_add(0, ids, bias)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor([*prompt_ids, *output_ids], dtype=torch.long, device=device)
        # scores: [num_seen]
        scores = logits.gather(0, seen)
        penalty = params.repetition_penalty
        scores = torch.where(scores < 0, scores * penalty, scores / penalty)
        logits = logits.scatter(0, seen, scores)
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        out = torch.tensor(output_ids, dtype=torch.long, device=device)
        # counts: [vocab]
        counts = torch.bincount(out, minlength=logits.shape[0]).to(logits.dtype)
        logits = (
            logits
            - params.frequency_penalty * counts
            - params.presence_penalty * (counts > 0).to(logits.dtype)
        )
    return logits


def _has_penalties(params: SamplingParams) -> bool:
    return (
        bool(params.logit_bias)
        or params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )


def is_plain_greedy(params: SamplingParams) -> bool:
    """True if the row's token is the first maximum of its logits as they are: greedy, no
    penalty or bias, no logprobs."""
    return params.is_greedy and not _has_penalties(params) and params.logprobs is None


def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Greedy argmax, or temperature → top-k → top-p → min-p → multinomial. logits: [vocab]."""
    if params.is_greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[0]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        # sorted_probs, order: [vocab], most likely first
        sorted_probs, order = torch.sort(probs, descending=True)
        # mass strictly before each token; a token is kept while that is still < top_p, so the
        # most likely token is always kept
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    # multinomial renormalises: probs need not sum to 1
    return int(torch.multinomial(probs, num_samples=1, generator=generator))


def _logprobs(logits: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    # logits: [vocab] (after penalties, before temperature)
    logp = torch.log_softmax(logits, dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if num_top:
        values, ids = torch.topk(logp, num_top)
        top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprobs(token_id, float(logp[token_id]), top)


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
) -> int:
    """Pick the next token id from one row of ``logits`` ([vocab] or [1, vocab]).

    Greedy (first argmax, as ``transformers``) when ``temperature == 0``.
    """
    # row: [vocab] float32
    row = logits.reshape(-1).float()
    if _has_penalties(params):
        row = apply_penalties(row, params, prompt_ids, output_ids)
    return _draw(row, params, generator)


def sample_batch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    token_ids: Sequence[Sequence[int]],
    num_prompt_tokens: Sequence[int],
    banned: torch.Tensor | Sequence[torch.Tensor | None] = (),
    argmax: Callable[[torch.Tensor], list[int]] | None = None,
) -> list[SampleResult]:
    """Next token of every row. logits: [num_rows, vocab] float32; per row its params, its
    generator, its tokens so far (prompt then output) and its prompt length; `banned`, the
    tokens a structured output forbids, applied first: a [num_rows, vocab] bool tensor, or per
    row a [vocab] one or None (free). `argmax`: each row's first maximum, as
    ``max(dim=-1).indices`` (a faster kernel the caller has), for the greedy rows."""
    num_rows = logits.shape[0]
    if isinstance(banned, torch.Tensor):
        logits.masked_fill_(banned, float("-inf"))
    else:
        for i, row in enumerate(banned):
            if row is not None:
                logits[i].masked_fill_(row, float("-inf"))
    results: list[SampleResult | None] = [None] * num_rows
    plain_greedy = [i for i in range(num_rows) if is_plain_greedy(params[i])]
    if plain_greedy:
        greedy = logits
        if len(plain_greedy) < num_rows:
            greedy = logits[torch.tensor(plain_greedy, device=logits.device)]
        # the first maximum of each row, as transformers' argmax (max(dim) returns the first
        # too, documented, and is 3x faster than argmax on CPU)
        best = argmax(greedy) if argmax is not None else greedy.max(dim=-1).indices.tolist()
        for i, token_id in zip(plain_greedy, best, strict=True):
            results[i] = SampleResult(int(token_id))
    for i in range(num_rows):
        if results[i] is not None:
            continue
        p, tokens, n = params[i], token_ids[i], num_prompt_tokens[i]
        row = logits[i]
        if _has_penalties(p):
            row = apply_penalties(row, p, tokens[:n], tokens[n:])
        token_id = _draw(row, p, generators[i])
        lp = None if p.logprobs is None else _logprobs(row, token_id, p.logprobs)
        results[i] = SampleResult(token_id, lp)
    return [r for r in results if r is not None]

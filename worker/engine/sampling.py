"""Sampling parameters of one request and the choice of the next token from its logits.

Example:

    >>> params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=7)
    >>> gen = torch.Generator().manual_seed(params.seed)
    >>> token_id = sample(logits, params, gen)  # logits: [vocab]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request generates; validated on construction (ValueError names the field)."""

    # most tokens to generate (>= 1); generation ends with "length" when reached
    max_tokens: int = 64
    # 0 = greedy (argmax); higher flattens the distribution
    temperature: float = 0.0
    # nucleus sampling: sample only from the smallest set of tokens holding this much mass
    top_p: float = 1.0
    # seeds this request's random generator; None = nondeterministic
    seed: int | None = None
    # generation ends with "stop" when the text contains one of these (not included in output)
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if not _is_number(self.temperature) or not self.temperature >= 0:
            raise ValueError(f"temperature: must be a number >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed: must be an integer or None, got {self.seed!r}")
        if isinstance(self.stop, list):  # friendlier for callers holding JSON lists
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop: must be a tuple of non-empty strings, got {self.stop!r}")


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick the next token id from ``logits`` ([vocab] or [1, vocab]).

    Greedy (first argmax, as ``transformers``) when ``temperature == 0``; otherwise softmax at
    ``temperature``, restricted to the top-p nucleus, sampled with ``generator``.
    """
    # logits: [vocab]
    logits = logits.reshape(-1)
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        # sorted_probs, order: [vocab], most likely first
        sorted_probs, order = torch.sort(probs, descending=True)
        # mass strictly before each token; a token is kept while that is still < top_p, so the
        # most likely token is always kept
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    # multinomial renormalises: probs need not sum to 1
    return int(torch.multinomial(probs, num_samples=1, generator=generator))

"""Sampling parameters of one request: validated on construction, no torch.

Example:

    >>> params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=7)
    >>> SamplingParams.from_job_input(JobInput("Hi", max_tokens=16, stop=("END",))).stop
    ('END',)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from common.job_input import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    JobInput,
    Structured,
)

# Most alternatives a request may ask log-probabilities for (OpenAI's limit).
MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request generates; ValueError names the offending field.

    Logits are processed in the order of ``transformers``: penalties, temperature, top-k,
    top-p, min-p, then a draw from the request's own seeded generator (greedy: argmax).
    """

    # most tokens to generate (>= 1); generation ends with "length" when reached
    max_tokens: int = DEFAULT_MAX_TOKENS
    # 0 = greedy (argmax); higher flattens the distribution
    temperature: float = DEFAULT_TEMPERATURE
    # nucleus sampling: sample only from the smallest set of tokens holding this much mass
    top_p: float = DEFAULT_TOP_P
    # sample only from the k most likely tokens; 0 = no limit
    top_k: int = 0
    # drop tokens whose probability is below min_p times the most likely one's; 0 = off
    min_p: float = 0.0
    # > 1 discourages tokens already in the prompt or output (CTRL / transformers semantics)
    repetition_penalty: float = 1.0
    # subtracted once from the logit of every token already generated (OpenAI semantics)
    presence_penalty: float = 0.0
    # subtracted from a token's logit once per time it was generated (OpenAI semantics)
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before anything else (OpenAI semantics:
    # -100 bans a token, 100 all but forces it)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # seeds this request's random generator; None = nondeterministic
    seed: int | None = None
    # generation ends with "stop" when the text contains one of these (not included in output)
    stop: tuple[str, ...] = ()
    # generation ends with "stop" after one of these tokens (its text is not included)
    stop_token_ids: tuple[int, ...] = ()
    # keep generating past the model's end-of-sequence tokens (benchmarks)
    ignore_eos: bool = False
    # return the sampled token's log-probability and this many top alternatives; None = off
    logprobs: int | None = None
    # what the output must match (worker.engine.structured); None = free text
    structured: Structured | None = None

    def __post_init__(self) -> None:
        _check_int(self.max_tokens, "max_tokens", minimum=1)
        _check_number(self.temperature, "temperature", ">= 0", lambda x: x >= 0)
        _check_number(self.top_p, "top_p", "in (0, 1]", lambda x: 0 < x <= 1)
        _check_int(self.top_k, "top_k", minimum=0)
        _check_number(self.min_p, "min_p", "in [0, 1]", lambda x: 0 <= x <= 1)
        _check_number(self.repetition_penalty, "repetition_penalty", "> 0", lambda x: x > 0)
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(getattr(self, name), name, "in [-2, 2]", lambda x: -2 <= x <= 2)
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        if not isinstance(self.logit_bias, tuple) or not all(
            isinstance(pair, tuple) and len(pair) == 2 and _is_int(pair[0]) and pair[0] >= 0
            for pair in self.logit_bias
        ):
            raise ValueError(
                f"logit_bias: must map token ids >= 0 to numbers, got {self.logit_bias!r}"
            )
        for _, bias in self.logit_bias:
            _check_number(bias, "logit_bias", "in [-100, 100]", lambda x: -100 <= x <= 100)
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed: must be an integer or None, got {self.seed!r}")
        if isinstance(self.stop, list):  # friendlier for callers holding JSON lists
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop: must be a tuple of non-empty strings, got {self.stop!r}")
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not isinstance(self.stop_token_ids, tuple) or not all(
            _is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(
                f"stop_token_ids: must be a list of token ids >= 0, got {self.stop_token_ids!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: must be true or false, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", minimum=0, maximum=MAX_LOGPROBS)
        if self.structured is not None and not isinstance(self.structured, Structured):
            raise ValueError(f"structured: expected a Structured, got {self.structured!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_job_input(cls, job_input: JobInput) -> SamplingParams:
        """A job's parameters (`common.job_input.JobInput`: every default already resolved)."""
        return cls(
            max_tokens=job_input.max_tokens,
            temperature=job_input.temperature,
            top_p=job_input.top_p,
            top_k=job_input.top_k,
            min_p=job_input.min_p,
            repetition_penalty=job_input.repetition_penalty,
            presence_penalty=job_input.presence_penalty,
            frequency_penalty=job_input.frequency_penalty,
            logit_bias=job_input.logit_bias,
            seed=job_input.seed,
            stop=job_input.stop,
            stop_token_ids=job_input.stop_token_ids,
            logprobs=job_input.logprobs,
            structured=job_input.structured,
        )


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_int(value: object, name: str, minimum: int, maximum: int | None = None) -> None:
    bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if not _is_int(value):
        raise ValueError(f"{name}: must be an integer {bounds}, got {value!r}")
    assert isinstance(value, int)
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name}: must be {bounds}, got {value}")


def _check_number(value: object, name: str, bounds: str, ok: Any) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value) or not ok(value):  # type: ignore[arg-type]
        raise ValueError(f"{name}: must be a number {bounds}, got {value!r}")

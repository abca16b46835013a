"""A job's input as it crosses the platform: validated at the API's edge (`api/schemas.py`
adds the bounds), stored in the job's row, carried by the claim (`common/messages.py`), and
turned into the engine's sampling parameters by the worker. Its defaults are stated here once.

Example:

    >>> JobInput.from_dict({"prompt": "Hi", "stop": "END"}).stop
    ('END',)
    >>> JobInput("Hi").to_dict()["max_tokens"]
    64
    >>> JobInput.from_dict({"prompt": "Hi", "logit_bias": {"42": -100}}).logit_bias
    ((42, -100.0),)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# What a job gets for a field neither the call nor its deployment's `defaults` set.
DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 0.0  # greedy
DEFAULT_TOP_P = 1.0  # no nucleus cut
# Most sequences one job generates from its prompt (`n`): each holds KV cache of its own.
MAX_CHOICES = 16
# Fields every row and claim carries; the others appear only when they differ from their
# default (a plain call's row stays small, and rows written before a field existed read back).
_ALWAYS = frozenset({"prompt", "max_tokens", "temperature", "top_p", "stop"})
# What a structured output may be constrained by (`Structured.kind`).
STRUCTURED_KINDS = ("json", "regex", "grammar", "choice")


@dataclass(frozen=True, slots=True)
class Structured:
    """What a job's output must match. JSON shape: one key, `{"json": <JSON schema>}`,
    `{"regex": "..."}`, `{"grammar": "<Lark / EBNF>"}` or `{"choice": ["a", "b"]}`."""

    # one of STRUCTURED_KINDS
    kind: str
    # the schema or the list of choices as JSON text; the regex or grammar as is
    value: str

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(f"structured: the kind is one of {list(STRUCTURED_KINDS)}")
        if not isinstance(self.value, str) or not self.value:
            raise ValueError(f"structured.{self.kind}: must not be empty")

    def to_dict(self) -> dict[str, Any]:
        value = json.loads(self.value) if self.kind in ("json", "choice") else self.value
        return {self.kind: value}

    @classmethod
    def from_dict(cls, data: Any) -> Structured:
        if not isinstance(data, Mapping) or len(data) != 1:
            raise ValueError(f"structured: must be one of {list(STRUCTURED_KINDS)}, as one key")
        ((kind, value),) = data.items()
        if kind in ("json", "choice"):
            if kind == "json" and not isinstance(value, Mapping):
                raise ValueError("structured.json: must be a JSON schema (an object)")
            if kind == "choice" and not (
                isinstance(value, list) and value and all(isinstance(c, str) for c in value)
            ):
                raise ValueError("structured.choice: must be a non-empty list of strings")
            value = json.dumps(value)  # key order kept: properties are generated in it
        elif not isinstance(value, str):
            raise ValueError(f"structured.{kind}: must be a string")
        return cls(str(kind), value)


_INTS = frozenset({"max_tokens", "seed", "top_k", "logprobs", "n"})


@dataclass(frozen=True, slots=True)
class JobInput:
    """One call's prompt and sampling, every field resolved (the call's value, else its
    deployment's default, else the platform's). Names and meanings are OpenAI's (and vLLM's
    for `top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`)."""

    # the text to continue (a chat's messages are rendered to one by the API)
    prompt: str
    # most tokens to generate
    max_tokens: int = DEFAULT_MAX_TOKENS
    # 0 = greedy
    temperature: float = DEFAULT_TEMPERATURE
    # nucleus sampling mass
    top_p: float = DEFAULT_TOP_P
    # sample only among the k most likely tokens; 0 = no limit
    top_k: int = 0
    # drop tokens less likely than min_p times the most likely one; 0 = off
    min_p: float = 0.0
    # > 1 discourages tokens already in the prompt or output (transformers' semantics)
    repetition_penalty: float = 1.0
    # subtracted once from the logit of every token already generated
    presence_penalty: float = 0.0
    # subtracted from a token's logit once per time it was generated
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before sampling (-100 bans, 100 forces)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # seeds the job's own random generator; None = nondeterministic
    seed: int | None = None
    # generation ends before the first of these strings
    stop: tuple[str, ...] = ()
    # generation ends after one of these tokens (its text is not part of the output)
    stop_token_ids: tuple[int, ...] = ()
    # the log-probability of each generated token and of this many alternatives; None = off
    logprobs: int | None = None
    # what the output must match (a JSON schema, a regex, a grammar, choices); None = free
    structured: Structured | None = None
    # sequences generated from the prompt (OpenAI's `n`): the prompt is computed once
    n: int = 1
    # False: the prompt is tokenized as is, no beginning-of-sequence token added (a chat
    # rendered by the model's template already holds its special tokens)
    add_special_tokens: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape (the job row's `input`, the claim's): the basic fields always, the
        others when set."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in _ALWAYS and value == f.default:
                continue
            if f.name == "logit_bias":
                value = {str(token): bias for token, bias in value}
            elif f.name == "structured":
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobInput:
        """Parse the JSON shape; a missing or null field takes its default, a bare string
        `stop` is one stop string. ValueError names a field of the wrong type (the engine
        checks the ranges it needs)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"input: expected an object, got {type(data).__name__}")
        prompt = data.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt: must be a string, got {type(prompt).__name__}")
        kwargs: dict[str, Any] = {"prompt": prompt}
        for f in fields(cls):
            value = data.get(f.name)
            if f.name == "prompt" or value is None:
                continue
            kwargs[f.name] = _typed(f.name, value)
        return cls(**kwargs)

    @classmethod
    def resolve(cls, call: Mapping[str, Any], defaults: Mapping[str, Any]) -> JobInput:
        """The call's fields over its deployment's `defaults`, over the platform's (the
        dataclass's own); null means unset at each level."""
        merged = {k: v for k, v in defaults.items() if v is not None}
        merged.update({k: v for k, v in call.items() if v is not None})
        return cls.from_dict(merged)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _typed(name: str, value: Any) -> Any:
    if name == "stop":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
            raise ValueError(f"stop: must be a list of strings, got {value!r}")
        return tuple(value)
    if name == "stop_token_ids":
        if not isinstance(value, list | tuple) or not all(_is_int(t) for t in value):
            raise ValueError(f"stop_token_ids: must be a list of integers, got {value!r}")
        return tuple(value)
    if name == "logit_bias":
        return _logit_bias(value)
    if name == "structured":
        return value if isinstance(value, Structured) else Structured.from_dict(value)
    if name == "add_special_tokens":
        if not isinstance(value, bool):
            raise ValueError(f"add_special_tokens: must be true or false, got {value!r}")
        return value
    if name in _INTS:
        if not _is_int(value):
            raise ValueError(f"{name}: must be an integer, got {value!r}")
        return value
    if not _is_number(value):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    return float(value)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """`{"token id": bias}` (OpenAI's shape: JSON keys are strings) or (id, bias) pairs,
    sorted by token id so that equal biases compare equal."""
    items = value.items() if isinstance(value, Mapping) else value
    pairs: list[tuple[int, float]] = []
    try:
        for token, bias in items:
            token_id = int(token) if isinstance(token, str) and token.isdigit() else token
            if not _is_int(token_id) or not _is_number(bias):
                raise ValueError
            pairs.append((token_id, float(bias)))
    except (TypeError, ValueError):
        raise ValueError(
            f'logit_bias: must map token ids to numbers ({{"42": -100}}), got {value!r}'
        ) from None
    return tuple(sorted(dict(pairs).items()))

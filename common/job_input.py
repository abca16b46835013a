"""A job's input as it crosses the platform: validated at the API's edge (`api/schemas.py`
adds the bounds), stored in the job's row, carried by the claim (`common/messages.py`), and
turned into the engine's sampling parameters by the worker. Its defaults are stated here once.

Example:

    >>> JobInput.from_dict({"prompt": "Hi", "stop": "END"}).stop
    ('END',)
    >>> JobInput("Hi").to_dict()["max_tokens"]
    64
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# What a job gets for a field neither the call nor its deployment's `defaults` set.
DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 0.0  # greedy
DEFAULT_TOP_P = 1.0  # no nucleus cut


@dataclass(frozen=True, slots=True)
class JobInput:
    """One call's prompt and sampling, every field resolved (the call's value, else its
    deployment's default, else the platform's)."""

    # the text to continue (a chat's messages are rendered to one by the API)
    prompt: str
    # most tokens to generate
    max_tokens: int = DEFAULT_MAX_TOKENS
    # 0 = greedy
    temperature: float = DEFAULT_TEMPERATURE
    # nucleus sampling mass
    top_p: float = DEFAULT_TOP_P
    # seeds the job's own random generator; None = nondeterministic
    seed: int | None = None
    # generation ends before the first of these strings
    stop: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape (the job row's `input`, the claim's): `seed` only when set."""
        out: dict[str, Any] = {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop),
        }
        if self.seed is not None:
            out["seed"] = self.seed
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


def _typed(name: str, value: Any) -> Any:
    if name == "stop":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
            raise ValueError(f"stop: must be a list of strings, got {value!r}")
        return tuple(value)
    if name in ("max_tokens", "seed"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: must be an integer, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    return float(value)

"""The built-in engine's request and output types in vLLM's terms, and back. Pure: no vLLM
import (the caller builds `vllm.SamplingParams(**sampling_kwargs(p))`), so the mapping is
tested in the platform's own environment.

>>> sampling_kwargs(SamplingParams(max_tokens=8, temperature=0.0))["max_tokens"]
8
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from worker.engine.outputs import FinishReason, TokenLogprobs
from worker.engine.params import SamplingParams

# vLLM's finish reasons that are ours by another name; anything else ends a request as "stop"
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def sampling_kwargs(p: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for `p` (one choice: the engine thread adds a
    job's other choices as requests of their own, as with the built-in engine). Not its stop
    strings: `VllmEngine` matches them in the text it makes (vLLM then runs without a
    detokenizer); `output_kind` is set by the caller (an enum of vLLM's)."""
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "min_p": p.min_p,
        "repetition_penalty": p.repetition_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "seed": p.seed,
        "stop_token_ids": list(p.stop_token_ids) or None,
        "ignore_eos": p.ignore_eos,
        "logprobs": p.logprobs,
        "logit_bias": dict(p.logit_bias) or None,
    }
    if p.structured is not None:
        kwargs["structured_outputs"] = structured_kwargs(p.structured.kind, p.structured.value)
    return kwargs


def structured_kwargs(kind: str, value: str) -> dict[str, Any]:
    """Keyword arguments of `vllm.sampling_params.StructuredOutputsParams` for one of the
    platform's structured kinds (json, regex, grammar, choice; see `common.job_input`)."""
    if kind == "json":
        return {"json": json.loads(value)}
    if kind == "choice":
        return {"choice": list(json.loads(value))}
    if kind in ("regex", "grammar"):
        return {kind: value}
    raise ValueError(f"structured: unknown kind {kind!r}")


def finish_reason(reason: str | None) -> FinishReason:
    return _FINISH.get(reason or "stop", "stop")


def token_logprobs(
    token_ids: Iterable[int], positions: Iterable[Mapping[int, Any]], k: int
) -> tuple[TokenLogprobs, ...]:
    """Each generated token's log-probability and its `k` best alternatives, from vLLM's
    per-position maps (token id → an object with `.logprob` and `.rank`, rank 1 best; the
    sampled token is always in its map, at its own rank)."""
    out = []
    for token_id, entries in zip(token_ids, positions, strict=False):
        ranked = sorted(
            ((lp.rank, tid, lp.logprob) for tid, lp in entries.items() if lp.rank is not None),
            key=lambda e: e[0],
        )
        top = tuple((tid, float(logprob)) for rank, tid, logprob in ranked if rank <= k)[:k]
        chosen = entries.get(token_id)
        logprob = float(chosen.logprob) if chosen is not None else float("-inf")
        out.append(TokenLogprobs(token_id, logprob, top))
    return tuple(out)

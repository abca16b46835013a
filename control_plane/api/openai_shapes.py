"""Pieces of the OpenAI routes' answers built from a job: finish reason, usage, and the
log-probabilities in each route's shape.

The worker reports log-probabilities per generated token in the chat shape
(`{"token", "bytes", "logprob", "top_logprobs": [{"token", "bytes", "logprob"}]}`, bytes
exact); completions use OpenAI's older shape, built here from the same entries.

Example:

    >>> entry = {"token": "Hi", "bytes": [72, 105], "logprob": -0.5,
    ...          "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5}]}
    >>> completion_logprobs([entry], 1, text_offset=0)["top_logprobs"]
    [{'Hi': -0.5}]
"""

from __future__ import annotations

from typing import Any


def finish_reason(job: dict[str, Any]) -> str:
    return _finish(job.get("output") or {})


def _finish(output: dict[str, Any]) -> str:
    return "length" if output.get("finish_reason") == "length" else "stop"


def choices(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Each choice's `index`, `text`, `finish_reason` (OpenAI's) and `logprobs` entries: the
    output's `choices` when the job generated several, else the output itself."""
    output = job.get("output") or {}
    listed = [c for c in output.get("choices") or [] if isinstance(c, dict)]
    return [
        {
            "index": int(c.get("index", i)),
            "text": str(c.get("text") or ""),
            "finish_reason": _finish(c),
            "logprobs": output_logprobs({"output": c}),
        }
        for i, c in enumerate(listed or [output])
    ]


def usage(job: dict[str, Any]) -> dict[str, int]:
    u = job.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("generated_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def output_logprobs(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's per-token entries (empty when it computed none)."""
    entries = (job.get("output") or {}).get("logprobs")
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def chat_logprobs(entries: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """A chat choice's `logprobs`: each token with `top` alternatives."""
    content = [
        {
            "token": e.get("token", ""),
            "logprob": e.get("logprob", 0.0),
            "bytes": e.get("bytes"),
            "top_logprobs": list(e.get("top_logprobs") or [])[:top],
        }
        for e in entries
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(
    entries: list[dict[str, Any]], top: int, text_offset: int
) -> dict[str, Any]:
    """A completion choice's `logprobs` (OpenAI's legacy shape); `text_offset` is where the
    first token's text starts in the choice's text (after an echoed prompt, past earlier
    chunks of a stream)."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(text_offset)
        token = str(e.get("token", ""))
        tokens.append(token)
        text_offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [e.get("logprob", 0.0) for e in entries],
        "top_logprobs": [_top_map(e, top) for e in entries],
        "text_offset": offsets,
    }


def _top_map(entry: dict[str, Any], top: int) -> dict[str, float]:
    alternatives = list(entry.get("top_logprobs") or [])[:top]
    return {str(alt.get("token", "")): alt.get("logprob", 0.0) for alt in alternatives}

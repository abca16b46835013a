"""Structured outputs at the API's edge: a call's `structured` (or OpenAI's `response_format`,
or vLLM's `structured_outputs`) read into the job's `common.job_input.Structured`, and its
grammar compiled once here, so that a schema, regex or grammar the worker could not use is the
caller's 4xx before anything is queued (the worker compiles it again against the model's
vocabulary: `worker/engine/structured.py`).

Example:

    >>> from_response_format({"type": "json_schema", "json_schema": {"name": "x",
    ...     "schema": {"type": "object"}}}).kind
    'json'
"""

from __future__ import annotations

import json
from typing import Any

from common.grammars import grammar_text
from common.job_input import STRUCTURED_KINDS, Structured

# A schema or grammar is program text from the caller: bounded like a prompt's share of a body.
MAX_SPEC_CHARS = 64 * 1024
# OpenAI's json_object mode: any JSON object.
ANY_OBJECT = '{"type": "object"}'


def checked(spec: Structured) -> Structured:
    """`spec` if its grammar compiles; ValueError with the compiler's words otherwise."""
    import llguidance

    if len(spec.value) > MAX_SPEC_CHARS:
        raise ValueError(
            f"the {spec.kind} is {len(spec.value):,} characters, above {MAX_SPEC_CHARS:,}"
        )
    if spec.kind == "choice":
        return spec  # any list of strings is a grammar
    try:
        grammar = grammar_text(spec)
    except ValueError as exc:
        raise ValueError(f"the {spec.kind} is not valid: {exc}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise ValueError(f"the {spec.kind} is not valid: {error.strip()[:500]}")
    return spec


def from_dict(data: Any) -> Structured:
    """A `structured` object of the platform's API (one of `STRUCTURED_KINDS` as its key)."""
    return checked(Structured.from_dict(data))


def from_response_format(value: Any) -> Structured | None:
    """OpenAI's `response_format`: None for `text`; ValueError for what it cannot be."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind == "json_object":
        return Structured("json", ANY_OBJECT)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("json_schema.schema must be a JSON schema (an object)")
        return checked(Structured("json", json.dumps(schema)))
    raise ValueError(f"type {kind!r} is not one of 'text', 'json_object', 'json_schema'")


def from_structured_outputs(value: Any) -> Structured | None:
    """vLLM's `structured_outputs` extension: `{"json": schema}`, `{"regex": ...}`,
    `{"grammar": ...}`, `{"choice": [...]}` or `{"json_object": true}`; None when empty."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("must be an object")
    set_ = {k: v for k, v in value.items() if v not in (None, False)}
    if set_ == {"json_object": True}:
        return Structured("json", ANY_OBJECT)
    unknown = sorted(set(set_) - set(STRUCTURED_KINDS))
    if unknown:
        raise ValueError(f"unknown keys {unknown}; one of {list(STRUCTURED_KINDS)} or json_object")
    return from_dict(set_) if set_ else None

"""A structured output's grammar in llguidance's terms (`common.job_input.Structured` →
grammar text), the one translation the API's edge check and the worker's matcher both use.
llguidance is imported on first use (the server and worker extras install it).

Example:

    >>> text = grammar_text(Structured("regex", "[a-z]+"))  # then LLMatcher(tokenizer, text)
"""

from __future__ import annotations

import json

from common.job_input import Structured

# JSON is generated compactly: with free whitespace a model (a random one above all) may spend
# its tokens on blanks and never close the document.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(spec: Structured) -> str:
    """llguidance's grammar for `spec` (not yet validated); ValueError for a JSON schema or a
    grammar it cannot read."""
    import llguidance

    matcher = llguidance.LLMatcher
    if spec.kind == "json":
        return matcher.grammar_from_json_schema(spec.value, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if spec.kind == "regex":
        return matcher.grammar_from_regex(spec.value)
    if spec.kind == "choice":
        return matcher.grammar_from_lark(_choice_lark(json.loads(spec.value)))
    return matcher.grammar_from_lark(lark_of(spec.value))


def lark_of(grammar: str) -> str:
    """A grammar as Lark: Lark (llguidance's dialect) as it is; GBNF / EBNF (`rule ::= ...`,
    llama.cpp's and xgrammar's) converted. ValueError when it is neither."""
    from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

    try:
        return str(any_to_lark(grammar))
    except GbnfToLarkError as exc:
        raise ValueError(f"the grammar is not valid: {exc}") from None


def _choice_lark(choices: list[str]) -> str:
    """One of the strings, exactly (as vLLM's `choice`)."""
    alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    return f"start: {alternatives}\n"

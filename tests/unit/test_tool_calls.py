"""Tool calls read from a model's text (Hermes / Qwen and Llama 3 JSON formats), whole and
streamed in any chunking, and the grammars that force a call."""

from __future__ import annotations

import json

import llguidance
import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.api.tool_calls import (
    StreamParser,
    ToolCall,
    forced_grammar,
    parse,
    parser_for,
)

CALL = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("plain answer", "plain answer", []),
        (CALL, None, [ToolCall("f", '{"x": 1}')]),
        ("Let me check. " + CALL, "Let me check. ", [ToolCall("f", '{"x": 1}')]),
        (
            CALL + "\n" + CALL.replace('"f"', '"g"'),
            None,
            [ToolCall("f", '{"x": 1}'), ToolCall("g", '{"x": 1}')],
        ),
        # arguments written as a JSON string are read as the object they hold
        (
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>',
            None,
            [ToolCall("f", '{"x": 1}')],
        ),
        # not the format: all content
        ('<tool_call>{"name": "f", "arguments": {"x": 1}', None, []),
        ("<tool_call>not json</tool_call>", None, []),
        (CALL + " and then some words", None, []),
        ('<tool_call>{"arguments": {}}</tool_call>', None, []),
    ],
)
def test_hermes(text: str, content: str | None, calls: list[ToolCall]) -> None:
    got_content, got_calls = parse("hermes", text)
    assert got_calls == calls
    assert got_content == (content if calls else text)


def test_llama3_json() -> None:
    assert parse("llama3_json", ' {"name": "f", "parameters": {"a": "b"}}') == (
        None,
        [ToolCall("f", '{"a": "b"}')],
    )
    assert parse("llama3_json", '{"answer": 1}') == ('{"answer": 1}', [])
    assert parse("llama3_json", "Sure: it is 3") == ("Sure: it is 3", [])


@given(
    st.sampled_from(["hermes", "llama3_json"]),
    st.sampled_from(
        [
            "Hi there",
            "Checking. " + CALL,
            CALL + CALL,
            '  {"name": "f", "parameters": {}}',
            "a <tool_ b",
            "<tool_call>{oops</tool_call>",
            "",
        ]
    ),
    st.lists(st.integers(min_value=0, max_value=80), max_size=6),
)
def test_a_stream_gives_what_the_whole_text_gives(parser: str, text: str, cuts: list[int]) -> None:
    stream = StreamParser(parser)
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    released = "".join(stream.feed(piece) for piece in pieces)
    rest, calls = stream.finish()
    content, whole_calls = parse(parser, text)
    assert calls == whole_calls
    assert released + rest == (content or "" if whole_calls else text)


def test_the_parser_follows_the_template() -> None:
    assert parser_for("auto", "{% for m in messages %}<tool_call>{% endfor %}") == "hermes"
    assert parser_for("auto", "<|start_header_id|>ipython<|end_header_id|>") == "llama3_json"
    assert parser_for("llama3_json", "<tool_call>") == "llama3_json"
    assert parser_for("auto", "no tools here") == "hermes"


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_forced_grammars_compile(parser: str) -> None:
    tools = [
        {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        {"name": "g", "parameters": None},
    ]
    for parallel in (False, True):
        grammar = llguidance.LLMatcher.grammar_from_lark(forced_grammar(parser, tools, parallel))
        assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    # what the grammar admits is what the parser reads
    text = CALL if parser == "hermes" else '{"name": "f", "parameters": {"x": 1}}'
    assert parse(parser, text)[1] == [ToolCall("f", json.dumps({"x": 1}))]

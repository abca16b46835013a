"""Tool calls in a model's text: the formats models are trained on, parsed (whole or as a
stream), and the grammars that make a model call a tool when the caller requires it.

Two formats, chosen per deployment (`tool_parser`), or from its chat template:

- `hermes` (Hermes, Qwen 2/2.5/3, and the platform's default template): each call is
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; text before the first call is
  the message's content;
- `llama3_json` (Llama 3.1+): the whole answer is one `{"name": ..., "parameters": {...}}`.

Example:

    >>> parse("hermes", 'On it. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    ('On it. ', [ToolCall(name='f', arguments='{"x": 1}')])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from common.grammars import JSON_OPTIONS  # compact JSON, as structured outputs write it

PARSERS = ("hermes", "llama3_json")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    # the arguments as a JSON text (OpenAI's `function.arguments`)
    arguments: str


def parser_for(setting: str, chat_template: str) -> str:
    """The deployment's parser: its setting, or for `auto` what its chat template writes."""
    if setting in PARSERS:
        return setting
    if _OPEN not in chat_template and (
        "<|python_tag|>" in chat_template or "ipython" in chat_template
    ):
        return "llama3_json"
    return "hermes"


def _call(obj: Any, arguments_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments))


def parse(parser: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """The message's content (None when it is only tool calls) and its tool calls; text that
    does not hold a well-formed call is all content."""
    if parser == "llama3_json":
        stripped = text.strip()
        try:
            call = _call(json.loads(stripped), "parameters") if stripped.startswith("{") else None
        except ValueError:
            call = None
        return (None, [call]) if call is not None else (text, [])
    start = text.find(_OPEN)
    if start < 0:
        return text, []
    calls: list[ToolCall] = []
    rest = text[start:]
    while rest.startswith(_OPEN):
        end = rest.find(_CLOSE)
        if end < 0:
            return text, []  # cut off inside a call: not a call
        try:
            call = _call(json.loads(rest[len(_OPEN) : end]), "arguments")
        except ValueError:
            call = None
        if call is None:
            return text, []
        calls.append(call)
        rest = rest[end + len(_CLOSE) :].lstrip()
    if rest:
        return text, []  # text after the calls: not the format
    return text[:start] or None, calls


class StreamParser:
    """A streamed answer's content, released as it comes except what may be a tool call
    (held until the end, where `finish` parses it)."""

    def __init__(self, parser: str) -> None:
        self.parser = parser
        self._text = ""  # everything received
        self._sent = 0  # characters released as content
        self._held = False  # a call may have started: nothing more is released

    def feed(self, delta: str) -> str:
        """The content this delta releases."""
        self._text += delta
        if self._held:
            return ""
        if self.parser == "llama3_json":
            if self._text.lstrip().startswith("{"):
                self._held = True
                return ""
            if not self._text.strip():
                return ""  # leading blanks: what follows decides
            return self._release(len(self._text))
        start = self._text.find(_OPEN, self._sent)
        if start >= 0:
            self._held = True
            return self._release(start)
        # keep back a tail that could be the start of the marker
        keep = next(
            (k for k in range(min(len(_OPEN) - 1, len(self._text)), 0, -1)
             if _OPEN.startswith(self._text[-k:])),
            0,
        )  # fmt: skip
        return self._release(len(self._text) - keep)

    def _release(self, upto: int) -> str:
        out = self._text[self._sent : upto]
        self._sent = max(self._sent, upto)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content not yet released, and the tool calls."""
        content, calls = parse(self.parser, self._text)
        if calls:
            sent_content = self._text[: self._sent]
            return (content or "")[len(sent_content) :], calls
        return self._text[self._sent :], []


def forced_grammar(parser: str, tools: list[dict[str, Any]], parallel: bool) -> str:
    """A Lark grammar (llguidance's, with `%json`) whose language is tool calls of `tools`
    (`{"name", "parameters"}` each) in the parser's format: one, or one or more."""
    key = "parameters" if parser == "llama3_json" else "arguments"
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["name"]},
                key: tool.get("parameters") or {"type": "object"},
            },
            "required": ["name", key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema = json.dumps({"anyOf": variants, "x-guidance": JSON_OPTIONS})
    if parser == "llama3_json":
        return f"start: call\ncall: %json {schema}\n"
    repeat = "+" if parallel else ""
    return f'start: call{repeat}\ncall: "{_OPEN}" body "{_CLOSE}"\nbody: %json {schema}\n'

"""Tool calling on `/v1/chat/completions`: the request's `tools`, `tool_choice` and the tool
calls of earlier assistant turns (shapes and checks), and the answer's `tool_calls`.

`tool_choice` `none` leaves tools out of the answer; `auto` lets the model call them (its text
is parsed, `api/tool_calls.py`); `required` and a named function force a call with a grammar
(structured outputs), so the arguments always parse against the function's schema.

Example:

    >>> choice = forced_tools(
    ...     [Tool.model_validate({"type": "function", "function": {"name": "f"}})], "required"
    ... )
    >>> [t["name"] for t in choice]
    ['f']
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.job_input import Structured
from control_plane.api.schemas import Line, Text
from control_plane.api.tool_calls import ToolCall, forced_grammar
from control_plane.errors import InvalidRequest

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Line
    description: Text | None = Field(None, max_length=10_000)
    # a JSON schema of the arguments (an object); none: no arguments
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("a function name is 1-64 letters, digits, '_' or '-'")
        return v


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionSpec

    def for_template(self) -> dict[str, Any]:
        """As chat templates take it (transformers' shape)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class CalledFunction(BaseModel):
    name: Line = Field(max_length=64)
    arguments: Text  # JSON text, as OpenAI sends it back


class MessageToolCall(BaseModel):
    """A call an earlier assistant turn made (sent back by the client with the history)."""

    id: Line = Field(max_length=256)
    type: Literal["function"] = "function"
    function: CalledFunction

    def for_template(self) -> dict[str, Any]:
        # templates read the arguments as an object (Qwen's `tool_call.arguments | tojson`)
        try:
            arguments: Any = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": arguments},
        }


def tool_choice_mode(choice: Any, tools: list[Tool] | None) -> str | None:
    """`none`, `auto`, `required`, or the function's name; InvalidRequest names
    `tool_choice` for what it cannot be."""
    names = [t.function.name for t in tools or []]
    if choice is None:
        return "auto" if names else "none"
    if choice in ("none", "auto", "required"):
        if choice != "none" and not names:
            raise InvalidRequest(
                f"'tool_choice' {choice!r} needs 'tools'", param="tool_choice", code="invalid_value"
            )
        return str(choice)
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not name:
        raise InvalidRequest(
            "'tool_choice' is 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
            code="invalid_value",
        )
    if name not in names:
        raise InvalidRequest(
            f"'tool_choice' names {name!r}, which is not in 'tools'",
            param="tool_choice",
            code="invalid_value",
        )
    return f"function:{name}"


def forced_tools(tools: list[Tool], mode: str) -> list[dict[str, Any]]:
    """The tools a forced call may use (`required`: any; a name: that one), as
    `{"name", "parameters"}`."""
    chosen = [t for t in tools if mode == "required" or mode == f"function:{t.function.name}"]
    return [{"name": t.function.name, "parameters": t.function.parameters} for t in chosen]


def forced_call(
    tools: list[Tool] | None, mode: str, parser: str, parallel: bool | None
) -> Structured | None:
    """The grammar a required or named call is sampled under (None: nothing forced): the
    parser's format with the chosen functions' schemas inside."""
    if mode in ("none", "auto") or not tools:
        return None
    # a named function is called once; `required` may make parallel calls unless told not to
    several = mode == "required" and parallel is not False
    grammar = forced_grammar(parser, forced_tools(tools, mode), several)
    return Structured("grammar", grammar)


def answer_calls(calls: list[ToolCall], job_id: str, index: int) -> list[dict[str, Any]]:
    """OpenAI's `tool_calls` of an answer; each id is stable for the job and the choice."""
    out = []
    for k, call in enumerate(calls):
        digest = hashlib.sha256(f"{job_id}/{index}/{k}".encode()).hexdigest()[:24]
        out.append(
            {
                "id": f"call_{digest}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        )
    return out

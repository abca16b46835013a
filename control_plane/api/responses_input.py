"""The `input` of a Responses API call as the chat it stands for: message items of text parts,
an earlier answer's `function_call` items and the caller's `function_call_output` for them.

Example:

    >>> message_of(InputItem(role="user", content="Hi"), "input[0]")
    {'role': 'user', 'content': 'Hi'}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.schemas import Line, Text
from control_plane.errors import InvalidRequest

ROLES = frozenset({"user", "system", "developer", "assistant"})
# Content parts that are text: the caller's (`input_text`) and an earlier answer's, sent back
# as conversation history (`output_text`, `refusal`).
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # `annotations`, `logprobs` of an earlier output

    type: Line
    text: Text | None = None
    refusal: Text | None = None


class InputItem(BaseModel):
    """One item of `input`: a message (`type` omitted means one), or an earlier answer's
    `function_call` and the caller's `function_call_output` for it."""

    model_config = ConfigDict(extra="allow")  # `id`, `status`, `phase` of an earlier output

    type: Line = "message"
    role: Line | None = None
    content: Text | list[ContentPart] | None = None
    # function_call: the call; function_call_output: which call it answers, and the answer
    call_id: Line | None = Field(None, max_length=256)
    name: Line | None = Field(None, max_length=64)
    arguments: Text | None = None
    output: Text | None = None


def called(item: InputItem, name: str) -> dict[str, Any]:
    """An earlier answer's `function_call` item as chat's tool call."""
    if item.call_id is None or item.name is None or item.arguments is None:
        raise InvalidRequest(
            f"'{name}' needs 'call_id', 'name' and 'arguments'", param=name,
            code="missing_required_parameter",
        )  # fmt: skip
    return {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


def message_of(item: InputItem, name: str) -> dict[str, str]:
    """One input item as a chat message; `name` is its parameter (`input[2]`)."""
    if item.type != "message":
        raise InvalidRequest(
            f"Invalid value for '{name}.type': items of type {item.type!r} are not supported "
            "(messages of text only)",
            param=f"{name}.type",
        )
    if item.role not in ROLES:
        raise InvalidRequest(
            f"Invalid value for '{name}.role': {item.role!r} is not one of {sorted(ROLES)}",
            param=f"{name}.role",
        )
    if item.content is None:
        raise InvalidRequest(
            f"Missing required parameter: '{name}.content'.",
            param=f"{name}.content",
            code="missing_required_parameter",
        )
    if isinstance(item.content, str):
        return {"role": item.role, "content": item.content}
    return {"role": item.role, "content": "".join(_text_of(p, f"{name}.content[{j}]")
                                                  for j, p in enumerate(item.content))}  # fmt: skip


def _text_of(part: ContentPart, name: str) -> str:
    field = TEXT_PARTS.get(part.type)
    if field is None:
        raise InvalidRequest(
            f"Invalid value for '{name}.type': content of type {part.type!r} is not supported "
            f"(text parts only: {sorted(TEXT_PARTS)})",
            param=f"{name}.type",
        )
    text = getattr(part, field)
    if text is None:
        raise InvalidRequest(
            f"Missing required parameter: '{name}.{field}'.",
            param=f"{name}.{field}",
            code="missing_required_parameter",
        )
    return str(text)

"""The request body of OpenAI's Responses API (`POST /v1/responses`), served stateless: every
parameter of OpenAI's reference is honoured or refused with a 400 naming it, as on the chat
route (`openai_requests.py`), and the call becomes the chat it stands for, rendered with the
deployment's chat template as `/v1/chat/completions` renders it.

`RESPONSES_PARAMETERS` lists each parameter with what the platform does with it. Nothing is
stored: `store: true`, `previous_response_id`, `conversation` and `background` are refused,
so a response is only ever the answer to the call that made it.

Example:

    >>> body = ResponsesRequest(model="demo", input="Hi", instructions="Be brief.")
    >>> [(m["role"], m["content"]) for m in body.checked().messages()]
    [('system', 'Be brief.'), ('user', 'Hi')]
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from common.job_input import Structured
from control_plane.api import structured_spec
from control_plane.api.openai_requests import (
    ChatCompletionRequest,
    Check,
    _absent_only,
    _honoured,
    _not_supported,
    _only,
    refuse_unsupported,
)
from control_plane.api.schemas import JobInput, Line, Text
from control_plane.errors import InvalidRequest

# `include` values honoured: log-probabilities of the output text, and the encrypted content
# of reasoning items (agent frameworks ask for it whenever `store` is false; this platform
# produces no reasoning items, so there is never any to include).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = frozenset({LOGPROBS_INCLUDE, "reasoning.encrypted_content"})
ROLES = frozenset({"user", "system", "developer", "assistant"})
# Content parts that are text: the caller's (`input_text`) and an earlier answer's, sent back
# as conversation history (`output_text`, `refusal`).
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


def _reasoning(value: Any) -> str | None:
    # `{"effort": null, "summary": null}` asks for nothing; any effort or summary does
    if value is None or (isinstance(value, dict) and all(v is None for v in value.values())):
        return None
    return "is not supported: the models served here do not reason in a separate channel"


def _include(value: Any) -> str | None:
    unknown = [v for v in value or [] if v not in INCLUDABLE]
    if not unknown:
        return None
    return f"supports only {sorted(INCLUDABLE)} on this platform, not {unknown[0]!r}"


_STATELESS = "is not supported: responses are not stored (this API is served stateless)"

# OpenAI's reference for POST /v1/responses (`client.responses.create`).
RESPONSES_PARAMETERS: dict[str, Check] = {
    "model": _honoured,
    "input": _honoured,  # a string, or message items of text parts
    "instructions": _honoured,  # a system message before the input
    "max_output_tokens": _honoured,
    "temperature": _honoured,
    "top_p": _honoured,
    "stream": _honoured,
    "stream_options": _honoured,  # include_obfuscation: no padding is sent either way
    "text": _honoured,  # format: text, json_object, json_schema (structured_spec.py)
    "top_logprobs": _honoured,  # with include ["message.output_text.logprobs"]
    "include": _include,
    # an end-user id for abuse tracking: accepted, echoed, never logged with content
    "user": _honoured,
    "safety_identifier": _honoured,
    "metadata": _honoured,  # echoed in the response
    # prefix caching is automatic: the key is a hint the platform does not need
    "prompt_cache_key": _honoured,
    "prompt_cache_retention": _honoured,
    "prompt_cache_options": _absent_only,
    # no tool is ever offered, so any limit on tool calls holds
    "max_tool_calls": _honoured,
    "service_tier": _only("auto", "default", why="supports only 'auto' and 'default' here"),
    # a prompt longer than the context is a 400; dropping the oldest items is not offered
    "truncation": _only("disabled", why="supports only 'disabled' on this platform"),
    "store": _only(False, why=_STATELESS),
    "previous_response_id": _only(None, why=_STATELESS),
    "conversation": _only(None, why=_STATELESS),
    "background": _only(False, why="is not supported: a response is answered on its call"),
    "background_options": _absent_only,
    "tools": _not_supported,
    "tool_choice": _only("none", why="is not supported by this platform yet (only 'none')"),
    "parallel_tool_calls": _not_supported,
    "reasoning": _reasoning,
    "prompt": _absent_only,  # stored prompt templates: none are stored here
    "context_management": _not_supported,
    "access_programs": _absent_only,
    "image": _absent_only,
    "moderation": _absent_only,
}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # `annotations`, `logprobs` of an earlier output

    type: str
    text: Text | None = None
    refusal: Text | None = None


class InputItem(BaseModel):
    """One item of `input`; only messages are served (`type` omitted means one)."""

    model_config = ConfigDict(extra="allow")  # `id`, `status`, `phase` of an earlier output

    type: str = "message"
    role: str | None = None
    content: Text | list[ContentPart] | None = None


class ResponseStreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # OpenAI pads streamed events against length side channels by default; no padding here
    include_obfuscation: bool | None = None


class ResponsesRequest(BaseModel):
    # Parameters outside the model's fields land in `model_extra`, where `refuse_unsupported`
    # answers each by name (refused or unrecognized): never dropped unseen.
    model_config = ConfigDict(extra="allow")

    model: Line = Field(min_length=1, description="deployment name")
    input: Text | list[InputItem]
    instructions: Text | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    stream_options: ResponseStreamOptions | None = None
    text: dict[str, Any] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = Field(None, max_length=16)
    user: Line | None = Field(None, max_length=256)
    safety_identifier: Line | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    prompt_cache_key: Line | None = Field(None, max_length=1024)
    prompt_cache_retention: Line | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    service_tier: Line | None = None
    truncation: Line | None = None
    store: bool | None = None
    previous_response_id: Line | None = None
    conversation: Any = None
    background: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None

    def checked(self) -> ResponsesRequest:
        """Self, once every parameter sent is honoured and the input and `text` are read
        (InvalidRequest, a 400, names the parameter at fault)."""
        refuse_unsupported(RESPONSES_PARAMETERS, self)
        self.messages()
        self.format()
        return self

    def messages(self) -> list[dict[str, str]]:
        """The chat this call stands for: `instructions` as the first (system) message."""
        head = [] if self.instructions is None else [system(self.instructions)]
        if isinstance(self.input, str):
            return [*head, {"role": "user", "content": self.input}]
        if not self.input:
            raise InvalidRequest(
                "'input' must hold at least one message", param="input", code="empty_array"
            )
        return head + [message_of(item, f"input[{i}]") for i, item in enumerate(self.input)]

    def format(self) -> dict[str, Any] | None:
        """`text.format` as sent (None: plain text)."""
        text = self.text or {}
        unknown = sorted(set(text) - {"format", "verbosity"})
        if unknown:
            raise InvalidRequest(
                f"Unrecognized request argument supplied: text.{unknown[0]}",
                param=f"text.{unknown[0]}",
                code="unknown_parameter",
            )
        if text.get("verbosity") is not None:
            raise InvalidRequest(
                "'text.verbosity' is not supported by this platform yet",
                param="text.verbosity",
                code="unsupported_parameter",
            )
        fmt = text.get("format")
        if fmt is not None and not isinstance(fmt, dict):
            raise InvalidRequest("'text.format' must be an object", param="text.format")
        return fmt

    def structured(self) -> Structured | None:
        """What the output must match (`text.format`: the Responses API puts `name` and
        `schema` in the format itself, where chat's `response_format` wraps them)."""
        fmt = self.format()
        if fmt is not None and fmt.get("type") == "json_schema":
            if not isinstance(fmt.get("schema"), dict):
                raise InvalidRequest(
                    "'text.format.schema' must be a JSON schema (an object)",
                    param="text.format.schema",
                )
            fmt = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
        try:
            return structured_spec.from_response_format(fmt)
        except ValueError as exc:
            raise InvalidRequest(f"'text.format': {exc}", param="text.format") from None

    def logprobs_asked(self) -> int | None:
        """Alternatives per token the job computes; None: no log-probabilities."""
        return (self.top_logprobs or 0) if LOGPROBS_INCLUDE in (self.include or []) else None

    def chat_request(self) -> ChatCompletionRequest:
        """The chat request whose rendering and sampling this call shares."""
        return ChatCompletionRequest.model_validate(
            {
                "model": self.model,
                "messages": self.messages(),
                "temperature": self.temperature,
                "top_p": self.top_p,
            }
        )

    def job_input(
        self,
        chat: ChatCompletionRequest,
        prompt: str,
        special_tokens: bool,
        structured: Structured | None,
    ) -> JobInput:
        """The job of `chat` (`chat_request`) rendered as `prompt`; `structured`: this call's
        (`structured()`, compiled once per call)."""
        job_input = chat.job_input(
            prompt, self.max_output_tokens, self.logprobs_asked(), special_tokens
        )
        if structured is None:
            return job_input
        return job_input.model_copy(update={"structured": structured.to_dict()})

    def echoed(self) -> dict[str, Any]:
        """The request's settings as OpenAI's response object repeats them."""
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": self.max_tool_calls,
            "metadata": self.metadata or {},
            "model": self.model,
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "previous_response_id": None,
            "prompt": None,
            "prompt_cache_key": self.prompt_cache_key,
            "prompt_cache_retention": self.prompt_cache_retention,
            "reasoning": {"effort": None, "summary": None},
            "safety_identifier": self.safety_identifier,
            "service_tier": "default",
            "store": False,
            # OpenAI's defaults, which the job uses too
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "text": {"format": self.format() or {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "none" if self.tool_choice == "none" else "auto",
            "tools": [],
            "top_logprobs": self.top_logprobs or 0,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "truncation": "disabled",
            "user": self.user,
        }


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

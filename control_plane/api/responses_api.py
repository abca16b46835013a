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

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.job_input import Structured
from control_plane.api import structured_spec
from control_plane.api.openai_requests import (
    ChatCompletionRequest,
    Check,
    absent_only,
    honoured,
    not_supported,
    only,
    refuse_unsupported,
)
from control_plane.api.responses_input import InputItem, called, message_of, system
from control_plane.api.schemas import JobInput, Line, Text
from control_plane.errors import InvalidRequest

# `include` values honoured: log-probabilities of the output text, and the encrypted content
# of reasoning items (agent frameworks ask for it whenever `store` is false; this platform
# produces no reasoning items, so there is never any to include).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = frozenset({LOGPROBS_INCLUDE, "reasoning.encrypted_content"})


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
    "model": honoured,
    "input": honoured,  # a string, or message items of text parts
    "instructions": honoured,  # a system message before the input
    "max_output_tokens": honoured,
    "temperature": honoured,
    "top_p": honoured,
    "stream": honoured,
    "stream_options": honoured,  # include_obfuscation: no padding is sent either way
    "text": honoured,  # format: text, json_object, json_schema (structured_spec.py)
    "top_logprobs": honoured,  # with include ["message.output_text.logprobs"]
    "include": _include,
    # an end-user id for abuse tracking: accepted, echoed, never logged with content
    "user": honoured,
    "safety_identifier": honoured,
    "metadata": honoured,  # echoed in the response
    # prefix caching is automatic: the key is a hint the platform does not need
    "prompt_cache_key": honoured,
    "prompt_cache_retention": honoured,
    "prompt_cache_options": absent_only,
    # a limit on calls to OpenAI's built-in tools (web search, ...): none runs here
    "max_tool_calls": honoured,
    "service_tier": only("auto", "default", why="supports only 'auto' and 'default' here"),
    # a prompt longer than the context is a 400; dropping the oldest items is not offered
    "truncation": only("disabled", why="supports only 'disabled' on this platform"),
    "store": only(False, why=_STATELESS),
    "previous_response_id": only(None, why=_STATELESS),
    "conversation": only(None, why=_STATELESS),
    "background": only(False, why="is not supported: a response is answered on its call"),
    "background_options": absent_only,
    # function tools, as on chat (openai_tools.py); other kinds are refused by `chat_tools`
    "tools": honoured,
    "tool_choice": honoured,
    "parallel_tool_calls": honoured,
    "reasoning": _reasoning,
    "prompt": absent_only,  # stored prompt templates: none are stored here
    "context_management": not_supported,
    "access_programs": absent_only,
    "image": absent_only,
    "moderation": absent_only,
}


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
    include: list[Line] | None = Field(None, max_length=16)
    user: Line | None = Field(None, max_length=256)
    safety_identifier: Line | None = Field(None, max_length=256)
    metadata: dict[str, Text] | None = Field(None, max_length=16)
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

    def messages(self) -> list[dict[str, Any]]:
        """The chat this call stands for: `instructions` as the first (system) message; an
        earlier answer's function calls as an assistant turn's `tool_calls` (consecutive ones
        in one turn), each output as a `tool` turn."""
        head: list[dict[str, Any]] = (
            [] if self.instructions is None else [system(self.instructions)]
        )
        if isinstance(self.input, str):
            return [*head, {"role": "user", "content": self.input}]
        if not self.input:
            raise InvalidRequest(
                "'input' must hold at least one message", param="input", code="empty_array"
            )
        out = head
        for i, item in enumerate(self.input):
            name = f"input[{i}]"
            if item.type == "function_call":
                call = called(item, name)
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                    last["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif item.type == "function_call_output":
                if item.call_id is None or item.output is None:
                    raise InvalidRequest(
                        f"'{name}' needs 'call_id' and 'output'", param=name,
                        code="missing_required_parameter",
                    )  # fmt: skip
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
            else:
                out.append(message_of(item, name))
        return out

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """`tools` in chat's shape (`{"type": "function", "function": {...}}`); only
        function tools are served (OpenAI's hosted tools run on OpenAI)."""
        if not self.tools:
            return None
        out = []
        for i, tool in enumerate(self.tools):
            if tool.get("type") != "function":
                raise InvalidRequest(
                    f"'tools[{i}].type' {tool.get('type')!r} is not supported: only function "
                    "tools are (the hosted tools of OpenAI's API run on OpenAI)",
                    param=f"tools[{i}].type",
                    code="unsupported_parameter",
                )
            spec = {k: v for k, v in tool.items() if k != "type" and v is not None}
            out.append({"type": "function", "function": spec})
        return out

    def chat_tool_choice(self) -> Any:
        """`tool_choice` in chat's shape (a named function is `{"type": "function", "name"}`
        here, `{"type": "function", "function": {"name"}}` there)."""
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
            return {"type": "function", "function": {"name": choice["name"]}}
        return choice

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
        chat = {
            "model": self.model,
            "messages": self.messages(),
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.tools:
            chat.update(tools=self.chat_tools(), parallel_tool_calls=self.parallel_tool_calls)
        if self.tool_choice is not None:
            chat["tool_choice"] = self.chat_tool_choice()
        try:
            return ChatCompletionRequest.model_validate(chat).checked()
        except ValidationError as exc:
            # a tool's shape: named as the Responses API spells it
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "function")
            raise InvalidRequest(
                f"Invalid value for '{where}': {error.get('msg')}", param=where
            ) from None

    def job_input(
        self,
        chat: ChatCompletionRequest,
        prompt: str,
        special_tokens: bool,
        structured: Structured | None,
        forced: Structured | None = None,
    ) -> JobInput:
        """The job of `chat` (`chat_request`) rendered as `prompt`; `structured`: this call's
        (`structured()`, compiled once per call); `forced`: a required tool call's grammar."""
        job_input = chat.job_input(
            prompt, self.max_output_tokens, self.logprobs_asked(), special_tokens, forced
        )
        if structured is None or forced is not None:
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
            "tool_choice": self.tool_choice or ("auto" if self.tools else "none"),
            "tools": self.tools or [],
            "top_logprobs": self.top_logprobs or 0,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "truncation": "disabled",
            "user": self.user,
        }

"""The OpenAI routes' request bodies: every parameter of OpenAI's reference is either honoured
or refused with a 400 naming it; none is accepted and silently ignored.

`CHAT_PARAMETERS` and `COMPLETION_PARAMETERS` list each parameter with what the platform does
with it; `refuse_unsupported` applies the refusals (a parameter that is not in the list at all
is refused as unrecognized, as OpenAI does). The extensions vLLM added to the same routes
(`top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`) are honoured too.

Example:

    >>> refusal(CHAT_PARAMETERS, "tools", [{"type": "function"}])
    "'tools' is not supported by this platform yet"
    >>> refusal(CHAT_PARAMETERS, "n", 1) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.job_input import MAX_CHOICES, Structured
from control_plane.api import structured_spec
from control_plane.api.openai_tools import MessageToolCall, Tool, tool_choice_mode
from control_plane.api.schemas import JobInput, Line, Text, unicode_text
from control_plane.errors import InvalidRequest

# What a parameter's value is refused for: a reason, or None when the value is honoured.
Check = Callable[[Any], str | None]


def honoured(_: Any) -> None:
    return None


def not_supported(value: Any) -> str | None:
    if value in (None, False, [], {}, ""):
        return None  # the parameter's "off" value asks for nothing
    return "is not supported by this platform yet"


def absent_only(value: Any) -> str | None:
    # for parameters whose mere presence asks for something (`web_search_options: {}` turns
    # web search on with its defaults)
    return None if value is None else "is not supported by this platform yet"


def only(*allowed: Any, why: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value is None or value in allowed else why

    return check


def _text_modalities(value: Any) -> str | None:
    if value is None or (isinstance(value, list) and set(value) <= {"text"}):
        return None
    return "supports only ['text'] on this platform"


# Shared by both routes (OpenAI's reference lists them on each).
_SHARED: dict[str, Check] = {
    "model": honoured,
    "max_tokens": honoured,
    "temperature": honoured,
    "top_p": honoured,
    "stop": honoured,
    "seed": honoured,
    "n": honoured,  # 1..MAX_CHOICES (the field's bound)
    "stream": honoured,
    "stream_options": honoured,
    "frequency_penalty": honoured,
    "presence_penalty": honoured,
    "logit_bias": honoured,
    "logprobs": honoured,
    # an end-user id for abuse tracking: accepted, never logged with content
    "user": honoured,
    # vLLM's extensions of these routes
    "top_k": honoured,
    "min_p": honoured,
    "repetition_penalty": honoured,
    "stop_token_ids": honoured,
    # vLLM's structured outputs: json, regex, grammar, choice, json_object
    "structured_outputs": honoured,
}

CHAT_PARAMETERS: dict[str, Check] = {
    **_SHARED,
    "messages": honoured,
    "max_completion_tokens": honoured,
    "top_logprobs": honoured,
    "response_format": honoured,  # text, json_object, json_schema (structured_spec.py)
    "modalities": _text_modalities,
    # prefix caching is automatic: the key is a hint the platform does not need
    "prompt_cache_key": honoured,
    "prompt_cache_retention": honoured,
    "safety_identifier": honoured,
    # kept only with store=true, which is refused
    "metadata": honoured,
    "store": only(False, why="is not supported: completions are not stored for retrieval"),
    "service_tier": only("auto", "default", why="supports only 'auto' and 'default' here"),
    # tool calling (api/openai_tools.py): checked against each other in `checked`
    "tool_choice": honoured,
    "tools": honoured,
    "parallel_tool_calls": honoured,
    "functions": not_supported,
    "function_call": only("none", why="is not supported by this platform yet"),
    "audio": absent_only,
    "prediction": absent_only,
    "reasoning_effort": not_supported,
    "verbosity": not_supported,
    "web_search_options": absent_only,
}

COMPLETION_PARAMETERS: dict[str, Check] = {
    **_SHARED,
    "prompt": honoured,
    "echo": honoured,
    "best_of": honoured,  # equal to n (checked below): ranking the choices is not offered
    "suffix": not_supported,
}


def refusal(table: Mapping[str, Check], name: str, value: Any) -> str | None:
    """Why the parameter `name` with `value` is refused (a sentence naming it), or None."""
    check = table.get(name)
    if check is None:
        return f"Unrecognized request argument supplied: {name}"
    why = check(value)
    return None if why is None else f"'{name}' {why}"


def refuse_unsupported(table: Mapping[str, Check], body: BaseModel) -> None:
    """Raise InvalidRequest (400 on these routes) for the first parameter sent that the
    platform does not honour; `param` names it."""
    sent = {name: getattr(body, name) for name in body.model_fields_set}
    sent.update(body.model_extra or {})
    for name, value in sent.items():
        why = refusal(table, name, value)
        if why is not None:
            code = "unsupported_parameter" if name in table else "unknown_parameter"
            raise InvalidRequest(why, param=name, code=code)


class StreamOptions(BaseModel):
    include_usage: bool = False
    # OpenAI pads streamed chunks against length side channels by default; no padding here
    include_obfuscation: bool | None = None


class _Common(BaseModel):
    # Parameters outside the model's fields land in `model_extra`, where `refuse_unsupported`
    # answers each by name (refused or unrecognized): never dropped unseen.
    model_config = ConfigDict(extra="allow")

    model: Line = Field(min_length=1, description="deployment name")
    max_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: Text | list[Text] | None = Field(None, max_length=8)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(None, max_length=300)
    user: Line | None = Field(None, max_length=256)
    top_k: int | None = Field(None, ge=-1, le=1_000_000, description="0 or -1: no limit")
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    structured_outputs: dict[str, Any] | None = None

    def structured(self) -> Structured | None:
        """What the output must match; InvalidRequest names the parameter at fault."""
        response_format = getattr(self, "response_format", None)
        if response_format is not None and self.structured_outputs is not None:
            raise InvalidRequest(
                "'response_format' and 'structured_outputs' cannot be used together",
                param="structured_outputs",
            )
        try:
            if response_format is not None:
                return structured_spec.from_response_format(response_format)
        except ValueError as exc:
            raise InvalidRequest(f"'response_format': {exc}", param="response_format") from None
        try:
            return structured_spec.from_structured_outputs(self.structured_outputs)
        except ValueError as exc:
            raise InvalidRequest(
                f"'structured_outputs': {exc}", param="structured_outputs"
            ) from None

    def job_input(
        self,
        prompt: str,
        max_tokens: int | None,
        logprobs: int | None,
        special_tokens: bool,
        forced: Structured | None = None,
    ) -> JobInput:
        """The job's input; `forced`: a grammar that replaces the request's own structured
        output (a required tool call)."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return JobInput(
            prompt=prompt,
            max_tokens=max_tokens,
            # OpenAI's default temperature is 1.
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=self.top_p,
            top_k=None if self.top_k is None else max(self.top_k, 0),
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias,
            seed=self.seed,
            stop=stop,
            stop_token_ids=self.stop_token_ids,
            logprobs=logprobs,
            n=self.n,
            structured=None if (spec := forced or self.structured()) is None else spec.to_dict(),
            add_special_tokens=None if special_tokens else False,
        )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[dict[str, Any]] | None = None
    # an assistant turn's calls, and a tool turn's answer to one of them
    tool_calls: list[MessageToolCall] | None = Field(None, max_length=128)
    tool_call_id: Line | None = Field(None, max_length=256)

    @field_validator("content")
    @classmethod
    def _text_parts_only(
        cls, v: str | list[dict[str, Any]] | None
    ) -> str | list[dict[str, Any]] | None:
        # Checked at the edge: an image or audio part is the caller's input, a 400, never a 500.
        for part in v if isinstance(v, list) else []:
            if part.get("type") != "text" or not isinstance(part.get("text", ""), str):
                raise ValueError(
                    f"message content of type {part.get('type')!r} is not supported "
                    "(text parts only)"
                )
            unicode_text(part.get("text", ""))  # a part's text is Text too
        return v

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(str(part.get("text", "")) for part in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [call.for_template() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    response_format: dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1, le=32_768)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Line | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def tool_mode(self) -> str:
        """`none`, `auto`, `required` or `function:<name>` (`openai_tools.tool_choice_mode`)."""
        return tool_choice_mode(self.tool_choice, self.tools) or "none"

    def checked(self) -> ChatCompletionRequest:
        refuse_unsupported(CHAT_PARAMETERS, self)
        mode = self.tool_mode()
        if mode not in ("none", "auto") and self.structured() is not None:
            raise InvalidRequest(
                "a forced tool call ('tool_choice' required or a function) and a structured "
                "output cannot be asked together",
                param="tool_choice",
                code="invalid_value",
            )
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest(
                "'top_logprobs' requires 'logprobs' to be true",
                param="top_logprobs",
                code="invalid_value",
            )
        return self

    def logprobs_asked(self) -> int | None:
        """Alternatives per token the job computes; None: no log-probabilities."""
        return (self.top_logprobs or 0) if self.logprobs else None


# Most choices (prompts x n) one completions call runs, each prompt as a job of its own.
MAX_PROMPT_CHOICES = 64


class CompletionRequest(_Common):
    # text, or a list of texts (token-id prompts are refused: a prompt is text here)
    prompt: Text | list[Text]
    max_tokens: int | None = Field(16, ge=1, le=32_768)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)

    def checked(self) -> CompletionRequest:
        refuse_unsupported(COMPLETION_PARAMETERS, self)
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise InvalidRequest(
                "'best_of' other than n is not supported by this platform yet (the choices "
                "are not ranked)",
                param="best_of",
                code="unsupported_parameter",
            )
        if self.echo and self.logprobs is not None:
            raise InvalidRequest(
                "'echo' with 'logprobs' is not supported: the prompt's log-probabilities are "
                "not computed",
                param="echo",
                code="unsupported_parameter",
            )
        return self

    def prompts(self) -> list[str]:
        """The prompts, one job each (more belong in a batch: /v1/batches)."""
        prompts = [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        if not prompts:
            raise InvalidRequest("'prompt' is an empty list", param="prompt", code="empty_array")
        if len(prompts) * (self.n or 1) > MAX_PROMPT_CHOICES:
            raise InvalidRequest(
                f"{len(prompts)} prompts x n={self.n or 1} choices is more than "
                f"{MAX_PROMPT_CHOICES} in one call; send more as a batch (/v1/batches)",
                param="prompt",
                code="invalid_value",
            )
        return prompts

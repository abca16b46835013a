"""The OpenAI routes' parameter tables: every parameter of OpenAI's reference is listed, an
"off" value is never refused, and a refusal or an unknown parameter names itself."""

from __future__ import annotations

import pytest

from common.job_input import Structured
from control_plane.api.openai_requests import (
    CHAT_PARAMETERS,
    COMPLETION_PARAMETERS,
    ChatCompletionRequest,
    CompletionRequest,
    refusal,
)
from control_plane.errors import InvalidRequest

# OpenAI's reference (create chat completion; create completion), typed here independently.
CHAT = [
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
]
COMPLETION = [
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
]


@pytest.mark.parametrize(
    ("table", "reference"), [(CHAT_PARAMETERS, CHAT), (COMPLETION_PARAMETERS, COMPLETION)]
)
def test_every_reference_parameter_is_listed(
    table: dict[str, object], reference: list[str]
) -> None:
    assert sorted(set(reference) - set(table)) == []
    for name in reference:
        # the parameter's "off" value asks for nothing, so it is never refused
        assert refusal(table, name, None) is None, name


def test_refusals_name_the_parameter() -> None:
    assert refusal(CHAT_PARAMETERS, "n", 4) is None
    assert refusal(CHAT_PARAMETERS, "response_format", {"type": "text"}) is None
    assert refusal(CHAT_PARAMETERS, "tool_choice", "none") is None
    assert "'functions'" in (refusal(CHAT_PARAMETERS, "functions", [{"name": "f"}]) or "")
    assert refusal(CHAT_PARAMETERS, "modalities", ["text"]) is None
    assert refusal(CHAT_PARAMETERS, "modalities", ["text", "audio"]) is not None
    assert refusal(CHAT_PARAMETERS, "nope", 1) == "Unrecognized request argument supplied: nope"


def test_a_request_is_checked_by_name() -> None:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "audio": {"x": 1}}
    )
    with pytest.raises(InvalidRequest) as refused:
        body.checked()
    assert refused.value.extra["param"] == "audio"
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}
    )
    with pytest.raises(InvalidRequest) as alone:
        body.checked()
    assert alone.value.extra["param"] == "top_logprobs"
    ok = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True,
            "top_logprobs": 2,
            "n": 1,
            "tool_choice": "none",
            "top_k": -1,
        }
    ).checked()
    assert ok.logprobs_asked() == 2
    assert ok.job_input("p", 4, 2, special_tokens=False).resolved({}).top_k == 0
    ranked = CompletionRequest.model_validate({"model": "m", "prompt": "x", "best_of": 3})
    with pytest.raises(InvalidRequest) as best_of:
        ranked.checked()
    assert best_of.value.extra["param"] == "best_of"
    CompletionRequest.model_validate({"model": "m", "prompt": "x", "best_of": 2, "n": 2}).checked()
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "x", "suffix": "y"})
    with pytest.raises(InvalidRequest) as suffix:
        completion.checked()
    assert suffix.value.extra["param"] == "suffix"


def test_structured_outputs_are_read_from_either_parameter() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    body = ChatCompletionRequest.model_validate({**base, "response_format": fmt}).checked()
    spec = body.structured()
    assert spec is not None and spec.kind == "json" and spec.to_dict() == {"json": schema}
    plain = ChatCompletionRequest.model_validate({**base, "response_format": {"type": "text"}})
    assert plain.structured() is None
    regex = ChatCompletionRequest.model_validate(
        {**base, "structured_outputs": {"regex": "[a-z]+"}}
    )
    assert regex.structured() == Structured("regex", "[a-z]+")
    no_schema = {"type": "json_schema", "json_schema": {"name": "x"}}
    both = {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}
    for bad, param in [
        ({"response_format": no_schema}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"sql": "x"}}, "structured_outputs"),
        (both, "structured_outputs"),
    ]:
        request = ChatCompletionRequest.model_validate({**base, **bad})
        with pytest.raises(InvalidRequest) as refused:
            request.structured()
        assert refused.value.extra["param"] == param, bad

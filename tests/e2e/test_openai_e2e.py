"""The official `openai` client against the live embedded platform (real worker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from sdk import Client

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def oai(platform: dict[str, Any], demo_model: Path) -> openai.OpenAI:
    Client(base_url=platform["url"], api_key=platform["api_key"]).deployments.create(
        name="chat", model=str(demo_model), scaledown_window_s=600
    )
    return openai.OpenAI(
        base_url=platform["url"] + "/v1", api_key=platform["api_key"], max_retries=0, timeout=120
    )


def test_models_lists_deployments(oai: openai.OpenAI) -> None:
    assert "chat" in [m.id for m in oai.models.list().data]


def test_chat_completion_plain_and_streamed(oai: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather?"},
    ]
    resp = oai.chat.completions.create(
        model="chat", messages=messages, max_tokens=12, temperature=0
    )
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.prompt_tokens > 5
    assert resp.usage.completion_tokens >= 1
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens

    stream = oai.chat.completions.create(
        model="chat",
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == choice.message.content, "greedy: streamed equals plain"
    assert finish == choice.finish_reason
    assert usage is not None and usage.completion_tokens == resp.usage.completion_tokens


def test_completions_plain_and_streamed(oai: openai.OpenAI) -> None:
    resp = oai.completions.create(model="chat", prompt="The weather", max_tokens=8, temperature=0)
    assert resp.choices[0].text and resp.usage is not None
    streamed = "".join(
        c.choices[0].text
        for c in oai.completions.create(
            model="chat", prompt="The weather", max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == resp.choices[0].text


def test_errors_in_openai_shape(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert "nope" in str(nf.value) and nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as long:
        oai.completions.create(model="chat", prompt="word " * 600, max_tokens=8)
    assert "context" in str(long.value)
    assert (long.value.code, long.value.param) == ("context_length_exceeded", "prompt")
    with pytest.raises(openai.BadRequestError) as long:
        oai.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "word " * 600}], max_tokens=8
        )
    assert (long.value.code, long.value.param) == ("context_length_exceeded", "messages")
    with pytest.raises(openai.BadRequestError) as two:  # above the most choices a job has
        oai.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], n=17
        )
    assert (two.value.code, two.value.param) == ("integer_above_max_value", "n")
    bad = openai.OpenAI(base_url=oai.base_url, api_key="pk_wrong_key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad.models.list()
    assert auth.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as unknown:
        oai.embeddings.create(model="chat", input="hi")
    assert unknown.value.code == "unknown_url"

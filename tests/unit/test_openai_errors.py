"""OpenAI's error object: every platform error has OpenAI's status, type and snake_case code;
validation errors name OpenAI's parameter (`messages[0].role`) and code; one test decides
which paths answer this shape."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from control_plane import errors
from control_plane.api.openai_errors import (
    OPENAI_ERRORS,
    for_exception,
    for_http,
    from_validation,
    param_name,
)
from control_plane.api.problems import is_openai_path

SNAKE = re.compile(r"^[a-z]+(_[a-z]+)*$")
# The types OpenAI's API answers (OpenAI's clients pick their exception by status alone).
TYPES = {"invalid_request_error", "permission_error", "rate_limit_exceeded", "server_error"}


def every_error_class() -> list[type[errors.ControlPlaneError]]:
    found, todo = [], [errors.ControlPlaneError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda c: c.__name__)
def test_every_platform_error_has_its_own_openai_row(cls: type[errors.ControlPlaneError]) -> None:
    row = OPENAI_ERRORS.get(cls)
    assert row is not None, f"{cls.__name__} has no OpenAI mapping in openai_errors.py"
    assert SNAKE.match(row.code), row.code
    assert row.type in TYPES
    # the platform's status, but 400 where problem+json says 422 (as OpenAI answers)
    assert row.status == (400 if cls.status == 422 else cls.status)
    assert (row.type == "server_error") == (row.status >= 500)


def test_the_rows_clients_test_for() -> None:
    assert OPENAI_ERRORS[errors.NotFound].code == "model_not_found"
    assert OPENAI_ERRORS[errors.Unauthorized].code == "invalid_api_key"
    assert OPENAI_ERRORS[errors.Unauthorized].type == "invalid_request_error"
    assert OPENAI_ERRORS[errors.RateLimited].code == "rate_limit_exceeded"
    assert OPENAI_ERRORS[errors.Forbidden].type == "permission_error"


def test_a_context_overflow_names_the_prompt_parameter_of_its_route() -> None:
    exc = errors.ContextTooLong("too long", limit=512)
    assert for_exception(exc, "/v1/chat/completions")[1] == "messages"
    row, param = for_exception(exc, "/v1/completions")
    assert param == "prompt" and row.code == "context_length_exceeded"
    # a subclass without a row of its own would take its nearest ancestor's
    assert for_exception(errors.InvalidRequest("x", param="n"), "/v1/completions")[1] == "n"


@pytest.mark.parametrize(
    ("path", "openai"),
    [
        ("/v1/chat/completions", True),
        ("/v1/completions", True),
        ("/v1/models", True),
        ("/v1/models/demo", True),
        ("/v1/responses", True),
        ("/v1/embeddings", True),
        ("/v1/images/generations", True),
        ("/v1/fine_tuning/jobs", True),
        ("/v1/vector_stores/vs_1/files", True),
        ("/v1/modelsx", False),
        ("/v1/batches", False),  # the platform's batches, not OpenAI's
        ("/v1/batches/b_1", False),
        ("/v1/files/data/in.jsonl", False),
        ("/v1/jobs", False),
        ("/v1/deployments/demo/run", False),
        ("/healthz", False),
    ],
)
def test_which_paths_answer_openai_errors(path: str, openai: bool) -> None:
    assert is_openai_path(path) is openai


@pytest.mark.parametrize(
    ("loc", "name"),
    [
        (("body", "messages", 0, "role"), "messages[0].role"),
        (("body", "messages", 1, "content", "list[dict[str,any]]", 0), "messages[1].content[0]"),
        (("body", "messages", 0, "content", "str"), "messages[0].content"),
        (("body", "max_tokens"), "max_tokens"),
        (("body",), None),
        (("prompt",), "prompt"),
    ],
)
def test_parameter_names_are_openai_s(loc: tuple[Any, ...], name: str | None) -> None:
    assert param_name(loc) == name


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[str] = Field(min_length=1)
    max_tokens: int = Field(16, ge=1, le=100)
    temperature: float = Field(1.0, le=2)


def _openai(body: dict[str, Any]) -> tuple[str, str | None, str | None]:
    with pytest.raises(ValidationError) as info:
        _Body.model_validate(body)
    return from_validation(list(info.value.errors()))


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "messages", "missing_required_parameter"),
        ({"messages": []}, "messages", "empty_array"),
        ({"messages": [3]}, "messages[0]", "invalid_type"),
        ({"messages": ["x"], "max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"messages": ["x"], "max_tokens": 101}, "max_tokens", "integer_above_max_value"),
        ({"messages": ["x"], "temperature": 2.5}, "temperature", "decimal_above_max_value"),
    ],
)
def test_validation_errors_take_openai_s_codes(body: dict[str, Any], param: str, code: str) -> None:
    message, got_param, got_code = _openai(body)
    assert (got_param, got_code) == (param, code)
    assert param in message and "Value error" not in message


def test_routing_errors() -> None:
    message, code = for_http(404, "POST", "/v1/embeddings")
    assert code == "unknown_url" and "POST /v1/embeddings" in message
    assert for_http(405, "GET", "/v1/chat/completions")[1] == "method_not_allowed"
    assert SNAKE.match(for_http(418, "GET", "/v1/models")[1])

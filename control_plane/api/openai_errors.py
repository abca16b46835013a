"""OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, for the routes that
OpenAI's clients call: the status, type and code OpenAI itself answers for each condition, so a
client's exception classes (`openai.NotFoundError`, `RateLimitError`, ...) and its checks of
`code` work unchanged. Which paths answer this shape: `problems.is_openai_path`.

Every `ControlPlaneError` class has its row in `OPENAI_ERRORS` (a unit test holds every class
to it); validation errors become OpenAI's codes and parameter names in `from_validation`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

from control_plane.errors import (
    Conflict,
    ContextTooLong,
    ControlPlaneError,
    Forbidden,
    InvalidRequest,
    JobFailed,
    JobStillRunning,
    NotFound,
    RateLimited,
    TemplateError,
    TooLarge,
    Unauthorized,
    Unavailable,
)

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class OpenAIError:
    status: int  # the HTTP status answered (OpenAI's: 400 where problem+json says 422)
    type: str  # `error.type`: OpenAI's class of error
    code: str  # `error.code`: what a client tests for, snake_case as OpenAI's codes are


_INVALID = "invalid_request_error"
OPENAI_ERRORS: dict[type[ControlPlaneError], OpenAIError] = {
    # A bug: the text of the exception stays in the server log.
    ControlPlaneError: OpenAIError(500, "server_error", "internal_error"),
    # On these routes only a model (a deployment) can be missing.
    NotFound: OpenAIError(404, _INVALID, "model_not_found"),
    Conflict: OpenAIError(409, _INVALID, "conflict"),
    InvalidRequest: OpenAIError(400, _INVALID, "invalid_value"),
    ContextTooLong: OpenAIError(400, _INVALID, "context_length_exceeded"),
    TemplateError: OpenAIError(400, _INVALID, "invalid_chat_template"),
    TooLarge: OpenAIError(413, _INVALID, "request_too_large"),
    # OpenAI answers a missing key and a wrong one alike: 401, invalid_request_error.
    Unauthorized: OpenAIError(401, _INVALID, "invalid_api_key"),
    Forbidden: OpenAIError(403, "permission_error", "insufficient_permissions"),
    # A per-minute bucket or the cap on jobs at once: a wait admits the request (Retry-After).
    # Not `insufficient_quota`, which OpenAI's clients take as "never retry".
    RateLimited: OpenAIError(429, "rate_limit_exceeded", "rate_limit_exceeded"),
    Unavailable: OpenAIError(503, "server_error", "service_unavailable"),
    JobFailed: OpenAIError(500, "server_error", "job_failed"),
    JobStillRunning: OpenAIError(504, "server_error", "timeout"),
}

# The type of an error that no table row names (a guard's refusal, a routing error).
_TYPE_OF_STATUS = {401: _INVALID, 403: "permission_error", 429: "rate_limit_exceeded"}


def openai_error(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    if error_type is None:
        error_type = _TYPE_OF_STATUS.get(status, _INVALID if status < 500 else "server_error")
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    # OpenAI answers 400 for invalid input; clients map 422 to a different exception.
    return JSONResponse(body, status_code=400 if status == 422 else status, headers=headers)


def for_exception(exc: ControlPlaneError, path: str) -> tuple[OpenAIError, str | None]:
    """The row of `exc`'s class (its nearest ancestor with one), its code replaced by the one
    the error names itself (`extra["code"]`: a refused parameter's `unsupported_parameter`),
    and the parameter it names."""
    row = next(OPENAI_ERRORS[c] for c in type(exc).__mro__ if c in OPENAI_ERRORS)
    code = exc.extra.get("code")
    if isinstance(code, str) and code:
        row = OpenAIError(row.status, row.type, code)
    param = exc.extra.get("param")
    if isinstance(exc, ContextTooLong) and param is None:
        param = "messages" if path == CHAT_PATH else "prompt"
    return row, None if param is None else str(param)


def for_http(status: int, method: str, path: str) -> tuple[str, str]:
    """Message and code of a routing error (no such route, or not with this method)."""
    if status == 404:
        return (
            f"Unknown request URL: {method} {path}. This platform does not serve this route "
            "of OpenAI's API; it serves /v1/models, /v1/completions, /v1/chat/completions and "
            "/v1/responses",
            "unknown_url",
        )
    if status == 405:
        return f"{method} is not allowed on {path}", "method_not_allowed"
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "HTTP error"
    return phrase, re.sub(r"[^a-z]+", "_", phrase.lower()).strip("_")


# Names pydantic gives the members of a union in an error's path.
_UNION_MEMBERS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def param_name(loc: Sequence[Any]) -> str | None:
    """OpenAI's name of a parameter: `messages[0].role` for pydantic's
    ("body", "messages", 0, "role"); None for the body as a whole."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part == "body" and not name:
            continue  # FastAPI's root of the request body
        elif not str(part).isidentifier() or str(part) in _UNION_MEMBERS:
            # a member of a union or a validator that pydantic names in the path ("str",
            # "list[dict[str,any]]", "function-after[...]"): no name of the client's
            continue
        else:
            name += f".{part}" if name else str(part)
    return name or None


def _code(error: Mapping[str, Any]) -> str | None:
    kind = str(error.get("type", ""))
    value = error.get("input")
    if kind == "missing":
        return "missing_required_parameter"
    if kind == "json_invalid":
        return None  # OpenAI names no code for a body it cannot parse
    if kind == "extra_forbidden":
        return "unknown_parameter"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        number = "integer" if isinstance(value, int) else "decimal"
        side = "below_min" if kind.startswith("greater") else "above_max"
        return f"{number}_{side}_value"
    if kind == "too_short" and value in ([], ()):
        return "empty_array"
    if kind == "too_long":
        return "string_above_max_length" if isinstance(value, str) else "array_above_max_length"
    if kind.endswith(("_type", "_parsing")):
        return "invalid_type"
    return "invalid_value"


def _message(error: Mapping[str, Any], param: str | None) -> str:
    kind = str(error.get("type", ""))
    cause = (error.get("ctx") or {}).get("error")
    # pydantic prefixes a validator's own words ("Value error, ..."): the words alone
    text = str(error.get("msg", "invalid")) if cause is None else str(cause)
    if kind == "missing":
        return f"Missing required parameter: '{param}'." if param else "The body is missing."
    if kind == "json_invalid":
        return f"We could not parse the JSON body of your request: {text}"
    if param is None:
        return text
    what = "type" if kind.endswith(("_type", "_parsing")) else "value"
    return f"Invalid {what} for '{param}': {text}"


def from_validation(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, str | None]:
    """Message, param and code of a request's validation errors: the first one's param and
    code (OpenAI names one), every error in the message."""
    if not errors:
        return "invalid request", None, None
    named = []
    for error in errors:
        param = None
        if error.get("type") != "json_invalid":  # its path ends in a character offset
            param = param_name(tuple(error.get("loc", ())))
        named.append((_message(error, param), param, _code(error)))
    message = "; ".join(m for m, _, _ in named)
    return message, named[0][1], named[0][2]

"""The one place where errors become responses: RFC 7807 `application/problem+json`, or
OpenAI's error object on the paths OpenAI's clients call (`is_openai_path`; the object and its
codes: `openai_errors`)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane.api import openai_errors
from control_plane.api.openai_errors import openai_error
from control_plane.errors import ControlPlaneError

log = logging.getLogger(__name__)
PROBLEM_BASE = "https://platform.dev/problems/"
PROBLEM_JSON = "application/problem+json"
# The OpenAI routes this platform serves: their clients (OpenAI's SDKs) expect OpenAI's error
# shape instead of problem+json, on these paths and any under them.
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses")
# The rest of OpenAI's API, not served here: a client pointed at this platform gets OpenAI's
# 404 for an unknown URL there. NOTE: /v1/batches and /v1/files are this platform's own routes
# (problem+json), not OpenAI's, though OpenAI has routes of those names.
OPENAI_UNSERVED = (
    "/v1/assistants", "/v1/audio", "/v1/chatkit", "/v1/containers", "/v1/conversations",
    "/v1/edits", "/v1/embeddings", "/v1/engines", "/v1/evals", "/v1/fine-tunes",
    "/v1/fine_tuning", "/v1/images", "/v1/moderations", "/v1/organization", "/v1/realtime",
    "/v1/threads", "/v1/uploads", "/v1/vector_stores", "/v1/videos",
)  # fmt: skip


def is_openai_path(path: str) -> bool:
    """Whether errors on `path` answer OpenAI's shape (the one test of it)."""
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PATHS + OPENAI_UNSERVED)


def refusal(
    path: str, status: int, slug: str, title: str, detail: str, code: str, **extra: Any
) -> JSONResponse:
    """A guard's answer before any route ran (body or headers too large, JSON nested too
    deep): OpenAI's shape with `code` on its paths, else problem+json with `extra`."""
    if is_openai_path(path):
        return openai_error(status, detail, code=code)
    return problem(status, slug, title, detail, path, **extra)


def problem(
    status: int, slug: str, title: str, detail: str, instance: str, **extra: Any
) -> JSONResponse:
    body = {
        "type": PROBLEM_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
        **extra,
    }
    headers = {}
    if _header_safe(extra.get("job_id")):
        headers["X-Job-Id"] = str(extra["job_id"])
    if "retry_after_s" in extra:
        headers["Retry-After"] = str(extra["retry_after_s"])
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _header_safe(value: Any) -> bool:
    """Ids echoed from a URL may hold any character; headers carry printable ASCII only."""
    return value is not None and str(value).isascii() and str(value).isprintable()


def _field(loc: tuple[Any, ...]) -> str:
    # Drop the "body" root that FastAPI puts in front of request-body fields.
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ControlPlaneError)
    async def _domain(request: Request, exc: ControlPlaneError) -> JSONResponse:
        path = request.url.path
        if is_openai_path(path):
            job_id = exc.extra.get("job_id")
            headers = {"X-Job-Id": str(job_id)} if _header_safe(job_id) else {}
            if "retry_after_s" in exc.extra:
                headers["Retry-After"] = str(exc.extra["retry_after_s"])
            row, param = openai_errors.for_exception(exc, path)
            return openai_error(
                row.status, exc.detail, error_type=row.type, param=param, code=row.code,
                headers=headers,
            )  # fmt: skip
        return problem(exc.status, exc.type_slug, exc.title, exc.detail, path, **exc.extra)

    # A request shape (RequestValidationError) or one built inside a route from request data
    # (a pydantic ValidationError, e.g. an OpenAI body mapped to a JobInput) failed: either is
    # the caller's input, so 422, never 500.
    @app.exception_handler(RequestValidationError)
    @app.exception_handler(ValidationError)
    async def _validation(
        request: Request, exc: RequestValidationError | ValidationError
    ) -> JSONResponse:
        if is_openai_path(request.url.path):
            message, param, code = openai_errors.from_validation(list(exc.errors()))
            return openai_error(400, message, param=param, code=code)
        errors = [
            {"field": _field(tuple(e.get("loc", ()))), "message": e.get("msg", "invalid")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem(
            422, "invalid-request", "Invalid Request", detail, request.url.path, errors=errors
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if is_openai_path(path):
            message, code = openai_errors.for_http(exc.status_code, request.method, path)
            return openai_error(exc.status_code, message, code=code, headers=exc.headers)
        slug = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}.get(
            exc.status_code, "http-error"
        )
        return problem(exc.status_code, slug, str(exc.detail), str(exc.detail), path)

    # Route errors end in `catch_all.CatchAll`; this takes what is raised outside it.
    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return internal_error(request.url.path)


def internal_error(path: str) -> JSONResponse:
    """The 500 for a bug: OpenAI-shaped on its paths, problem+json elsewhere; never the
    exception's text (it is in the server log)."""
    if is_openai_path(path):
        row = openai_errors.OPENAI_ERRORS[ControlPlaneError]
        return openai_error(
            row.status, "unexpected error; see server logs", error_type=row.type, code=row.code
        )
    return problem(
        500, "internal", "Internal Server Error", "unexpected error; see server logs", path
    )

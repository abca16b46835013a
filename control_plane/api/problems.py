"""The one place where errors become RFC 7807 `application/problem+json` responses."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane.errors import ControlPlaneError

log = logging.getLogger(__name__)
PROBLEM_BASE = "https://platform.dev/problems/"
PROBLEM_JSON = "application/problem+json"
# Paths whose clients (OpenAI SDKs) expect OpenAI's error shape instead of problem+json.
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")
_OPENAI_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
}


def openai_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": _OPENAI_TYPE.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }
    # OpenAI answers 400 for validation errors; clients map 422 to a different exception.
    return JSONResponse(body, status_code=400 if status == 422 else status, headers=headers)


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
        if request.url.path.startswith(OPENAI_PATHS):
            job_id = exc.extra.get("job_id")
            headers = {"X-Job-Id": str(job_id)} if _header_safe(job_id) else {}
            if "retry_after_s" in exc.extra:
                headers["Retry-After"] = str(exc.extra["retry_after_s"])
            code = "model_not_found" if exc.status == 404 else exc.type_slug
            param = exc.extra.get("param")
            return openai_error(exc.status, exc.detail, param=param, code=code, headers=headers)
        return problem(
            exc.status, exc.type_slug, exc.title, exc.detail, request.url.path, **exc.extra
        )

    # A request shape (RequestValidationError) or one built inside a route from request data
    # (a pydantic ValidationError, e.g. an OpenAI body mapped to a JobInput) failed: either is
    # the caller's input, so 422, never 500.
    @app.exception_handler(RequestValidationError)
    @app.exception_handler(ValidationError)
    async def _validation(
        request: Request, exc: RequestValidationError | ValidationError
    ) -> JSONResponse:
        errors = [
            {"field": _field(tuple(e.get("loc", ()))), "message": e.get("msg", "invalid")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        if request.url.path.startswith(OPENAI_PATHS):
            return openai_error(422, detail, param=errors[0]["field"] if errors else None)
        return problem(
            422, "invalid-request", "Invalid Request", detail, request.url.path, errors=errors
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}.get(
            exc.status_code, "http-error"
        )
        if request.url.path.startswith(OPENAI_PATHS):
            return openai_error(exc.status_code, str(exc.detail), code=slug)
        return problem(exc.status_code, slug, str(exc.detail), str(exc.detail), request.url.path)

    # Route errors end in `catch_all.CatchAll`; this takes what is raised outside it.
    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return internal_error(request.url.path)


def internal_error(path: str) -> JSONResponse:
    """The 500 for a bug: OpenAI-shaped on its paths, problem+json elsewhere; never the
    exception's text (it is in the server log)."""
    if path.startswith(OPENAI_PATHS):
        return openai_error(500, "unexpected error; see server logs")
    return problem(
        500, "internal", "Internal Server Error", "unexpected error; see server logs", path
    )

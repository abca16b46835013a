"""The one place where errors become RFC 7807 `application/problem+json` responses."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane.errors import ControlPlaneError

log = logging.getLogger(__name__)
PROBLEM_BASE = "https://platform.dev/problems/"
PROBLEM_JSON = "application/problem+json"


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
    if "job_id" in extra:
        headers["X-Job-Id"] = str(extra["job_id"])
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    # Drop the "body" root that FastAPI puts in front of request-body fields.
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ControlPlaneError)
    async def _domain(request: Request, exc: ControlPlaneError) -> JSONResponse:
        return problem(
            exc.status, exc.type_slug, exc.title, exc.detail, request.url.path, **exc.extra
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
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
        slug = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}.get(
            exc.status_code, "http-error"
        )
        return problem(exc.status_code, slug, str(exc.detail), str(exc.detail), request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return problem(
            500,
            "internal",
            "Internal Server Error",
            "unexpected error; see server logs",
            request.url.path,
        )

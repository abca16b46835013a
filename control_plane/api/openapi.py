"""The served OpenAPI document, completed: every operation documents its error answers in the
shape it really sends (problem+json, or OpenAI's error object on the OpenAI routes), and the
bearer-key security scheme."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from control_plane.api.problems import is_openai_path
from control_plane.api.schemas import Problem

ERROR_STATUSES = {
    "400": "Bad request",
    "401": "Missing or invalid API key",
    "403": "The key lacks a scope",
    "404": "Not found (or another tenant's)",
    "409": "Conflict",
    "413": "Request too large",
    "422": "Invalid input; `errors` names the fields",
    "429": "Rate limited; see Retry-After",
    "503": "A dependency is unavailable; nothing was accepted",
}
OPENAI_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
        for defs_name, defs in schemas["Problem"].pop("$defs", {}).items():
            schemas.setdefault(defs_name, defs)
        schemas["OpenAIError"] = OPENAI_ERROR_SCHEMA
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        doc["components"]["securitySchemes"] = {
            "apiKey": {"type": "http", "scheme": "bearer", "description": "pk_… API key"}
        }
        for path, item in doc.get("paths", {}).items():
            openai = is_openai_path(path)
            media = "application/json" if openai else "application/problem+json"
            ref = "#/components/schemas/" + ("OpenAIError" if openai else "Problem")
            for op in item.values():
                if path not in ("/healthz", "/readyz"):
                    op["security"] = [{"apiKey": []}]
                responses = op.setdefault("responses", {})
                for status, text in ERROR_STATUSES.items():
                    if openai and status == "422":
                        continue  # OpenAI answers validation errors with 400
                    responses[status] = {
                        "description": text,
                        "content": {media: {"schema": {"$ref": ref}}},
                    }
                if openai:
                    responses["500"] = {
                        "description": "The job failed",
                        "content": {media: {"schema": {"$ref": ref}}},
                    }
                    responses["504"] = {
                        "description": "Still running; poll the job in X-Job-Id",
                        "content": {media: {"schema": {"$ref": ref}}},
                    }
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]

"""Exceptions of the control plane, mapped to problem+json (or OpenAI's error shape on the
OpenAI routes) in one place (`api/problems.py`; OpenAI's status, type and code of each class:
`api/openai_errors.py`).

ControlPlaneError          500  (base; an unexpected error never leaks details)
 ├── NotFound          404  a resource of this tenant does not exist (or is another's)
 ├── Conflict          409  state conflict: name taken, idempotency key reused, stale attempt
 ├── InvalidRequest    422  input is well-formed JSON but not acceptable (names the field)
 │    └── ContextTooLong  422  prompt + max_tokens exceed the model's context (`limit`)
 ├── TooLarge          413  a streamed body (a file upload) passed its limit (`limit_bytes`)
 ├── Unauthorized      401  missing or unknown API key
 ├── Forbidden         403  key lacks the scope
 ├── RateLimited       429  a tenant quota is exhausted (`limit`, `retry_after_s`)
 ├── Unavailable       503  a dependency (Redis, broker) is down; nothing was accepted
 ├── JobFailed         500  an OpenAI-style call's job ended without output (names the job)
 └── JobStillRunning   504  an OpenAI-style call's job outlived the sync wait (poll the job)
"""

from __future__ import annotations

from typing import Any


class ControlPlaneError(Exception):
    status = 500
    type_slug = "internal"
    title = "Internal Server Error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        # Extra problem+json members (e.g. `errors`, `limit`); must be JSON-serialisable.
        self.extra = extra


class NotFound(ControlPlaneError):
    status = 404
    type_slug = "not-found"
    title = "Not Found"


class Conflict(ControlPlaneError):
    status = 409
    type_slug = "conflict"
    title = "Conflict"


class InvalidRequest(ControlPlaneError):
    status = 422
    type_slug = "invalid-request"
    title = "Invalid Request"


class ContextTooLong(InvalidRequest):
    """An InvalidRequest of its own kind only for OpenAI's clients, which know it by its code
    (`context_length_exceeded`); problem+json answers it as any invalid request."""


class TemplateError(InvalidRequest):
    """The model's chat template could not render a chat: it raised, or passed the renderer's
    bounds (time, output size, memory). The caller's input meeting the tenant's model files."""


class TooLarge(ControlPlaneError):
    status = 413
    type_slug = "too-large"
    title = "Payload Too Large"


class Unauthorized(ControlPlaneError):
    status = 401
    type_slug = "unauthorized"
    title = "Unauthorized"


class Forbidden(ControlPlaneError):
    status = 403
    type_slug = "forbidden"
    title = "Forbidden"


class Unavailable(ControlPlaneError):
    status = 503
    type_slug = "unavailable"
    title = "Service Unavailable"


class RateLimited(ControlPlaneError):
    status = 429
    type_slug = "rate-limited"
    title = "Too Many Requests"


class JobFailed(ControlPlaneError):
    status = 500
    type_slug = "job-failed"
    title = "Job Failed"


class JobStillRunning(ControlPlaneError):
    status = 504
    type_slug = "timeout"
    title = "Gateway Timeout"

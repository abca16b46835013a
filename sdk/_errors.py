"""Every exception the SDK raises, in one tree.

    PlatformError                   base: anything this package raises on purpose (.job_id)
    ├── APIError                    the platform answered with an error (RFC 7807 problem)
    │   ├── InvalidRequestError     400 / 413 / 422: the request is wrong; fix it, don't retry
    │   ├── AuthenticationError     401 / 403: missing, wrong or underprivileged API key
    │   ├── NotFoundError           404: no such deployment / job
    │   ├── ConflictError           409: e.g. a deployment with that name exists
    │   ├── RateLimitError          429 after retries (.retry_after)
    │   └── ServerError             5xx after retries: the platform failed
    ├── APIConnectionError          the platform could not be reached, after retries
    ├── JobError                    about one job (.job_id always set)
    │   ├── JobFailed               the job ended failed / canceled / expired / timed_out (.job)
    │   │   └── ModelError          ... because of the model or its input ("your model failed")
    │   ├── JobTimeout              the client stopped waiting; the job may still finish
    │   └── StreamRestarted         a stream's text cannot add up to its job's output (.job)
    ├── BatchTimeout                the client stopped waiting for a batch (.batch_id)
    ├── DeploymentNotReady          no worker of the version became ready (.reason, .timed_out)
    └── WebhookVerificationError    a webhook's signature, timestamp or headers are not valid

`ModelError` versus everything else mirrors Replicate's split: a `ModelError` is yours to fix
(bad input, a model that raises); the rest is the platform's or the network's.

NOTE: the transport error is `APIConnectionError` (openai-python's name), never
`ConnectionError`, so `from sdk import *` cannot shadow the builtin; `sdk.ConnectionError` is a
deprecated alias of it. It is no `APIError`: the platform never answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sdk._models import JobView

# error.type values that put the blame on the model or on the caller's input.
MODEL_ERROR_TYPES = frozenset({"model_error", "invalid_input"})


class PlatformError(Exception):
    """Base of every error raised by the SDK.

    `job_id` is set whenever the failing call concerned a job (from the body or the
    `X-Job-Id` header), so a sync call that fails half-way never loses its job.
    """

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.job_id = job_id


class APIError(PlatformError):
    """The platform answered with an error status and (usually) a problem+json body.

    Example:
        try:
            client.deployments.get("nope")
        except NotFoundError as e:
            print(e.status, e.detail)       # 404 deployment 'nope' does not exist
    """

    def __init__(
        self,
        status: int,
        type: str,
        title: str,
        detail: str,
        problem: Mapping[str, Any],
        job_id: str | None = None,
    ) -> None:
        message = f"{status} {title}: {detail}" if detail else f"{status} {title}"
        super().__init__(message, job_id=job_id)
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        # The whole problem document, e.g. problem["errors"] for 422 validation errors.
        self.problem: dict[str, Any] = dict(problem)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Field errors of a validation problem: [{"field": "input.max_tokens", "message": ..}]."""
        errors = self.problem.get("errors")
        return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []


class InvalidRequestError(APIError):
    """400, 413 or 422: the request itself is wrong (see `.errors` for the fields)."""


class AuthenticationError(APIError):
    """401 or 403: the API key is missing, wrong or not allowed to do this."""


class NotFoundError(APIError):
    """404: the deployment or job does not exist."""


class ConflictError(APIError):
    """409: the request conflicts with the current state (e.g. the name is taken)."""


class RateLimitError(APIError):
    """429 after every retry: slow down. `retry_after` is in seconds when the server said."""

    def __init__(
        self,
        status: int,
        type: str,
        title: str,
        detail: str,
        problem: Mapping[str, Any],
        job_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, type, title, detail, problem, job_id)
        self.retry_after = retry_after


class ServerError(APIError):
    """5xx after every retry: the platform failed; the request may be retried later."""


class APIConnectionError(PlatformError):
    """The platform could not be reached (refused, reset, timed out) after every retry.

    Example:
        try:
            client.jobs.get("job_1")
        except APIConnectionError as e:
            print("platform unreachable:", e)
    """


class JobError(PlatformError):
    """Base of errors about one job; `job_id` is always set."""

    job_id: str

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message, job_id=job_id)


class JobFailed(JobError):
    """The job ended without a result: failed, canceled, expired or timed_out.

    Example:
        try:
            client.run("demo", {"prompt": "Hi"})
        except JobFailed as e:
            print(e.job_id, e.status, e.error_type)
    """

    def __init__(self, job: JobView) -> None:
        error = job.error or {}
        self.job = job
        self.status = job.status
        self.error_type: str | None = _str_or_none(error.get("type"))
        self.error_message: str | None = _str_or_none(error.get("message"))
        message = f"job {job.id} {job.status}"
        if self.error_type:
            message += f": {self.error_type}"
        if self.error_message:
            message += f": {self.error_message}"
        super().__init__(message, job_id=job.id)


class ModelError(JobFailed):
    """The job failed because of the model or its input (error.type model_error/invalid_input)."""


class JobTimeout(JobError):
    """The client waited `timeout_s` and the job was not finished; it may still finish."""

    def __init__(self, job_id: str, timeout_s: float) -> None:
        super().__init__(
            f"job {job_id} did not finish within {timeout_s:g}s (it may still finish; "
            f"poll it with client.jobs.get({job_id!r}))",
            job_id=job_id,
        )
        self.timeout_s = timeout_s


class StreamRestarted(JobError):
    """A streamed run's job was run again (its worker was lost) and its new text departs from
    the text already streamed, which cannot be taken back: raised once the stream has ended,
    instead of a text that would differ from the job's output. `.job` is the job as it ended
    (its `.text` the true output); `.attempt` the attempt that produced it.

    Example:
        try:
            text = "".join(client.run("demo", {"prompt": "Hi"}, stream=True))
        except StreamRestarted as e:
            text = e.job.text  # redraw what was shown with this
    """

    def __init__(self, job: JobView, attempt: int | None) -> None:
        self.job = job
        self.attempt = attempt
        super().__init__(
            f"job {job.id} was run again after its worker was lost and its text departs from "
            "what was streamed; its output is in .job.text",
            job_id=job.id,
        )


class BatchTimeout(PlatformError):
    """The client waited `timeout_s` and the batch was not finished; its jobs go on."""

    def __init__(self, batch_id: str, timeout_s: float) -> None:
        super().__init__(
            f"batch {batch_id} did not finish within {timeout_s:g}s (its jobs go on; "
            f"poll it with client.batches.get({batch_id!r}))"
        )
        self.batch_id = batch_id
        self.timeout_s = timeout_s


class DeploymentNotReady(PlatformError):
    """`deployments.wait_ready` gave up: a worker of the version failed, or time ran out.

    Example:
        try:
            client.deployments.wait_ready("demo", timeout=300)
        except DeploymentNotReady as e:
            print(e.deployment, e.version, e.reason)   # demo 2 worker wrk_1 failed: ...
    """

    def __init__(
        self, deployment: str, version: int | None, reason: str, *, timed_out: bool
    ) -> None:
        at = f" version {version}" if version is not None else ""
        super().__init__(f"deployment {deployment!r}{at} is not ready: {reason}")
        self.deployment = deployment
        self.version = version
        self.reason = reason
        self.timed_out = timed_out  # True: time ran out; False: a worker failed


class WebhookVerificationError(PlatformError):
    """A webhook could not be verified: missing headers, bad signature, or stale timestamp."""


def job_failure(job: JobView) -> JobFailed:
    """The exception for a job that ended without a result (ModelError when it's the model's)."""
    error_type = (job.error or {}).get("type")
    if error_type in MODEL_ERROR_TYPES:
        return ModelError(job)
    return JobFailed(job)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None

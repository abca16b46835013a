"""Python SDK of the platform: run and manage LLM deployments over its REST API.

    from sdk import Client

    client = Client()                       # URL and key: arguments > env > `platform login`
    print(client.run("my-llm", {"prompt": "Hi"}))

`import sdk` needs only httpx: no server or worker code is ever imported from here.
"""

from __future__ import annotations

import warnings
from typing import Any

from sdk._async_batches import AsyncBatch
from sdk._async_client import AsyncClient
from sdk._async_jobs import AsyncJob
from sdk._batches import Batch
from sdk._client import Client
from sdk._errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    BatchTimeout,
    ConflictError,
    DeploymentNotReady,
    InvalidRequestError,
    JobError,
    JobFailed,
    JobTimeout,
    ModelError,
    NotFoundError,
    PlatformError,
    RateLimitError,
    ServerError,
    StreamRestarted,
    WebhookVerificationError,
)
from sdk._jobs import Job
from sdk._models import ApiKey, Deployment, StoredFile
from sdk._sse import RunStatus

__all__ = [
    "APIConnectionError",
    "APIError",
    "ApiKey",
    "AsyncBatch",
    "AsyncClient",
    "AsyncJob",
    "AuthenticationError",
    "Batch",
    "BatchTimeout",
    "Client",
    "ConflictError",
    "Deployment",
    "DeploymentNotReady",
    "InvalidRequestError",
    "Job",
    "JobError",
    "JobFailed",
    "JobTimeout",
    "ModelError",
    "NotFoundError",
    "PlatformError",
    "RateLimitError",
    "RunStatus",
    "ServerError",
    "StoredFile",
    "StreamRestarted",
    "WebhookVerificationError",
]


def __getattr__(name: str) -> Any:
    # NOTE: `ConnectionError` is kept for old callers but left out of __all__, so that
    # `from sdk import *` never shadows the builtin.
    if name == "ConnectionError":
        warnings.warn(
            "sdk.ConnectionError is deprecated: use sdk.APIConnectionError",
            DeprecationWarning,
            stacklevel=2,
        )
        return APIConnectionError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Python SDK of the platform: run and manage LLM deployments over its REST API.

    from sdk import Client

    client = Client()                       # URL and key: arguments > env > `platform login`
    print(client.run("my-llm", {"prompt": "Hi"}))

`import sdk` needs only httpx: no server or worker code is ever imported from here.
"""

from sdk._async_client import AsyncClient, AsyncJob
from sdk._batches import AsyncBatch, Batch
from sdk._client import Client, Job
from sdk._errors import (
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
    WebhookVerificationError,
)
from sdk._errors import PlatformConnectionError as ConnectionError
from sdk._models import ApiKey, Deployment

__all__ = [
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
    "ConnectionError",
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
    "ServerError",
    "WebhookVerificationError",
]

"""Both SDK clients, one test body: the `twin` fixture runs a test over `Client` and over
`AsyncClient`. The async one is driven through `Blocking`, which runs each coroutine it returns
to the end, so one test body holds both to the same behaviour."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import httpx
import pytest

from sdk import AsyncBatch, AsyncClient, AsyncJob, Batch, Client, Job
from sdk._async_batches import AsyncBatchResults
from sdk._async_jobs import AsyncStream
from sdk._async_resource import AsyncResource
from sdk._models import BatchView, JobView

# What Blocking wraps: the async SDK objects with coroutine methods or async iteration.
ASYNC_TYPES = (AsyncClient, AsyncResource, AsyncJob, AsyncStream, AsyncBatch, AsyncBatchResults)
# Blocking names whose async counterpart is spelled differently.
ASYNC_NAMES = {"close": "aclose"}


class Blocking:
    """A blocking view of an async SDK object: every coroutine it returns is run to its end on
    the test's event loop, `for`/`next` and `with` map onto `async for` and `async with`, and
    what comes back (a job, a stream, a resource) is viewed the same way.

    NOTE: `isinstance(view, AsyncJob)` holds, as for the object itself (`__class__`).
    """

    def __init__(self, target: Any, runner: asyncio.Runner) -> None:
        self._target = target
        self._runner = runner

    @property
    def __class__(self) -> type:
        return type(self._target)

    def _await(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            value = self._runner.run(value)
        if isinstance(value, list):
            return [self._await(item) for item in value]
        return Blocking(value, self._runner) if isinstance(value, ASYNC_TYPES) else value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, ASYNC_NAMES.get(name, name))
        if not inspect.ismethod(value):
            return self._await(value)
        return lambda *args, **kwargs: self._await(value(*args, **kwargs))

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return self._await(self._target.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> Any:
        return self._await(self._target.__aenter__())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._await(self._target.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        return repr(self._target)


class AsyncOver(httpx.AsyncBaseTransport):
    """A sync transport (a test double) offered to AsyncClient: each request is handled inline."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)


@dataclass(frozen=True)
class Twin:
    """One of the two clients, as the tests drive it."""

    name: str  # "sync" or "async": the test id
    Job: type[JobView]  # what a run with wait=False returns
    Batch: type[BatchView]  # what batches.create returns
    runner: asyncio.Runner | None = None  # the async client's event loop, one per test

    def client(
        self,
        *args: Any,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
        **kwargs: Any,
    ) -> Client:
        """`Client(*args, ...)`, or the same AsyncClient behind a Blocking view (typed as
        Client: it answers as one); a sync `transport` or `sleep` is adapted for it."""
        if self.runner is None:
            if sleep is not None:
                kwargs["sleep"] = sleep
            return Client(*args, transport=transport, **kwargs)
        if sleep is not None:
            blocking_sleep = sleep

            async def async_sleep(seconds: float) -> None:
                blocking_sleep(seconds)

            kwargs["sleep"] = async_sleep
        async_transport: httpx.AsyncBaseTransport | None = None
        if isinstance(transport, httpx.AsyncBaseTransport):
            async_transport = transport  # MockTransport serves both clients
        elif transport is not None:
            async_transport = AsyncOver(transport)
        client = AsyncClient(*args, transport=async_transport, **kwargs)
        return cast(Client, Blocking(client, self.runner))


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest) -> Iterator[Twin]:
    if request.param == "sync":
        yield Twin("sync", Job, Batch)
        return
    with asyncio.Runner() as runner:
        yield Twin("async", AsyncJob, AsyncBatch, runner)


MakeClient = Callable[..., Client]

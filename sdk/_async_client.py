"""The asyncio client: drives the same flows as `Client` with httpx.AsyncClient and asyncio.sleep.

Everything but the I/O lives in _base.py, _routes.py, _flows.py and _sse.py; keep it so.
"""

from __future__ import annotations

import asyncio
import builtins
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, cast, overload

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._base import Call, RetryPolicy, Runtime, job_id_header, secret_of, sync_wait_s
from sdk._batches import AsyncBatches
from sdk._config import resolve_credentials
from sdk._errors import PlatformConnectionError
from sdk._flows import Flow, Send, Sleep
from sdk._keys import AsyncKeys
from sdk._models import Deployment, JobView
from sdk._resource import AsyncResource
from sdk._sse import StreamState, settle
from sdk._usage import AsyncUsage

T = TypeVar("T")


class AsyncClient:
    """asyncio client for the platform's REST API; the same surface as `Client`, awaited.

    Example:
        from sdk import AsyncClient

        async with AsyncClient() as client:
            print(await client.run("demo", {"prompt": "Hi"}))
            async for delta in await client.run("demo", {"prompt": "Hi"}, stream=True):
                print(delta, end="", flush=True)
            job = await client.submit("demo", {"prompt": "Hi"})
            await job.wait(timeout=60)
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 30.0,
        max_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._rt = Runtime(
            credentials=resolve_credentials(base_url, api_key),
            timeout_s=timeout,
            policy=RetryPolicy(max_retries=max_retries),
            clock=clock,
            wall_clock=time.time,
            rand=rand,
        )
        self._sleep = sleep
        self._http = httpx.AsyncClient(transport=transport, timeout=timeout)
        self.jobs = AsyncJobs(self)
        self.deployments = AsyncDeployments(self)
        self.billing = AsyncBilling(self)
        self.workers = AsyncWorkers(self)
        self.webhooks = AsyncWebhooks(self)
        self.batches = AsyncBatches(self)
        self.keys = AsyncKeys(self)
        self.usage = AsyncUsage(self)

    @property
    def base_url(self) -> str:
        return self._rt.credentials.base_url

    @overload
    async def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: Literal[False] = ...,
        wait: Literal[True] = ...,
        timeout: float | None = ...,
    ) -> str: ...
    @overload
    async def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: Literal[True],
        wait: bool = ...,
        timeout: float | None = ...,
    ) -> AsyncStream: ...
    @overload
    async def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: Literal[False] = ...,
        wait: Literal[False],
        timeout: float | None = ...,
    ) -> AsyncJob: ...
    @overload
    async def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: bool = ...,
        wait: bool = ...,
        timeout: float | None = ...,
    ) -> str | AsyncStream | AsyncJob: ...

    async def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: bool = False,
        wait: bool = True,
        timeout: float | None = None,
    ) -> str | AsyncStream | AsyncJob:
        """See `Client.run`; `stream=True` gives an `AsyncStream` to `async for` over."""
        started_s = self._rt.clock()
        call = routes.run(
            deployment,
            input,
            stream=stream,
            wait_s=sync_wait_s(self._rt.timeout_s, timeout),
            idempotency_key=routes.new_idempotency_key(),
        )
        if stream:
            response = await self._execute(flows.send(self._rt, call))
            return AsyncStream(self, response, timeout, started_s)
        flow = flows.run(self._rt, call, wait=wait, timeout_s=timeout, started_s=started_s)
        job = AsyncJob(await self._execute(flow), self)
        if not wait:
            return job
        settle(job, "", recovered=False)
        return job.text or ""

    async def submit(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
        idempotency_key: str | None = None,
        ttl_s: float | None = None,
    ) -> AsyncJob:
        """See `Client.submit`: one Idempotency-Key for every retry of the call."""
        call = routes.submit(
            deployment,
            input,
            webhook=webhook,
            webhook_events=webhook_events,
            ttl_s=ttl_s,
            idempotency_key=idempotency_key or routes.new_idempotency_key(),
        )
        return AsyncJob(await self._execute(flows.request_job(self._rt, call)), self)

    async def _execute(self, flow: Flow[T]) -> T:
        """Drive a flow to its result with awaited I/O."""
        outcome: flows.Outcome = None
        while True:
            try:
                action = flow.send(outcome)
            except StopIteration as stop:
                return cast(T, stop.value)
            if isinstance(action, Sleep):
                await self._sleep(action.seconds)
                outcome = None
            else:
                outcome = await self._send(action)

    async def _send(self, action: Send) -> httpx.Response | httpx.TransportError:
        try:
            response = await self._http.send(action.request, stream=action.stream)
            if action.stream and response.is_error:
                await response.aread()  # the error body is parsed into the exception
        except httpx.TransportError as e:
            return e
        return response

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class AsyncJob(JobView):
    """`Job` for `AsyncClient`: the same fields, with awaitable `refresh`, `wait`, `cancel`."""

    __slots__ = ("_client",)

    def __init__(self, raw: dict[str, Any], client: AsyncClient) -> None:
        super().__init__(raw)
        self._client = client

    async def refresh(self) -> AsyncJob:
        flow = flows.request_job(self._client._rt, routes.get_job(self.id))
        self._raw = await self._client._execute(flow)
        return self

    async def wait(
        self, timeout: float | None = None, on_update: Callable[[AsyncJob], None] | None = None
    ) -> AsyncJob:
        """Poll until the job ends; JobFailed unless it succeeded, JobTimeout after `timeout`."""
        hook = None if on_update is None else lambda raw: on_update(AsyncJob(raw, self._client))
        self._raw = await self._client._execute(
            flows.wait_for_job(self._client._rt, self._raw, timeout, hook)
        )
        settle(self, "", recovered=False)
        return self

    async def cancel(self) -> AsyncJob:
        flow = flows.request_job(self._client._rt, routes.cancel_job(self.id))
        self._raw = await self._client._execute(flow)
        return self


class AsyncStream:
    """`Stream` for `AsyncClient`: `async for delta in stream`, then `stream.job`."""

    def __init__(
        self,
        client: AsyncClient,
        response: httpx.Response,
        timeout_s: float | None,
        started_s: float,
    ) -> None:
        self._client = client
        self._response = response
        self._timeout_s = timeout_s
        self._started_s = started_s
        self._state = StreamState(job_id_header(response))
        self._job: AsyncJob | None = None
        self._deltas = self._generate()

    @property
    def job_id(self) -> str | None:
        return self._state.job_id

    @property
    def job(self) -> AsyncJob | None:
        """The final job, once the stream has ended."""
        return self._job

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        return await self._deltas.__anext__()

    async def aclose(self) -> None:
        await self._deltas.aclose()
        await self._response.aclose()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _generate(self) -> AsyncGenerator[str, None]:
        # NOTE: mirrors Stream._generate line for line; only the awaits differ.
        state = self._state
        try:
            async for line in self._response.aiter_lines():
                delta = state.feed_line(line)
                if delta is not None:
                    yield delta
                if state.done:
                    break
        except httpx.TransportError as e:
            if state.job_id is None:
                raise PlatformConnectionError(f"the run stream broke off: {e}") from e
        finally:
            await self._response.aclose()
        recovered = state.final is None
        if state.final is not None:
            self._job = AsyncJob(state.final, self._client)
        elif state.job_id is None:
            raise PlatformConnectionError("the run stream ended before naming its job")
        else:
            remaining_s = None
            if self._timeout_s is not None:
                remaining_s = self._timeout_s - (self._client._rt.clock() - self._started_s)
            flow = flows.recover_stream(self._client._rt, state.job_id, remaining_s)
            self._job = AsyncJob(await self._client._execute(flow), self._client)
        rest = settle(self._job, state.seen_text, recovered=recovered)
        if rest:
            yield rest


# --- resources (the async twins of those in _client.py) ---


class _AsyncResource(AsyncResource):
    async def _job(self, call: Call) -> AsyncJob:
        raw = await self._run(flows.request_job(self._client._rt, call))
        return AsyncJob(raw, self._client)


class AsyncJobs(_AsyncResource):
    """`client.jobs` of AsyncClient."""

    async def get(self, job_id: str) -> AsyncJob:
        return await self._job(routes.get_job(job_id))

    async def list(
        self, deployment: str | None = None, status: str | None = None, limit: int | None = None
    ) -> builtins.list[AsyncJob]:
        raws = await self._list(routes.list_jobs(deployment, status), limit)
        return [AsyncJob(raw, self._client) for raw in raws]

    async def cancel(self, job_id: str) -> AsyncJob:
        return await self._job(routes.cancel_job(job_id))


class AsyncDeployments(_AsyncResource):
    """`client.deployments` of AsyncClient."""

    async def create(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> Deployment:
        return Deployment(await self._json(routes.create_deployment({**(spec or {}), **fields})))

    async def update(
        self, name: str, spec: Mapping[str, Any] | None = None, **fields: Any
    ) -> Deployment:
        call = routes.update_deployment(name, {**(spec or {}), **fields})
        return Deployment(await self._json(call))

    async def get(self, name: str) -> Deployment:
        return Deployment(await self._json(routes.get_deployment(name)))

    async def list(self) -> builtins.list[Deployment]:
        return [Deployment(raw) for raw in await self._list(routes.list_deployments(), None)]

    async def delete(self, name: str) -> None:
        await self._json(routes.delete_deployment(name))

    async def wait_ready(
        self,
        name: str,
        version: int | None = None,
        timeout: float | None = 600.0,
        on_update: Callable[[builtins.list[dict[str, Any]]], None] | None = None,
    ) -> dict[str, Any]:
        """See `Client.deployments.wait_ready`."""
        flow = flows.wait_ready(self._client._rt, name, version, timeout, on_update)
        return await self._run(flow)


class AsyncBilling(_AsyncResource):
    """`client.billing` of AsyncClient."""

    async def records(
        self,
        deployment: str | None = None,
        worker_id: str | None = None,
        phase: str | None = None,
        limit: int | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> list[dict[str, Any]]:
        return await self._list(
            routes.billing_records(deployment, worker_id, phase, since, until), limit
        )

    async def check(self) -> dict[str, Any]:
        """Drift between billing records, workers and jobs: `{"ok": bool, "issues": [...]}`."""
        result: dict[str, Any] = await self._json(routes.billing_check())
        return result


class AsyncWorkers(_AsyncResource):
    """`client.workers` of AsyncClient."""

    async def list(self, deployment: str | None = None) -> builtins.list[dict[str, Any]]:
        return await self._list(routes.list_workers(deployment), None)


class AsyncWebhooks(_AsyncResource):
    """`client.webhooks` of AsyncClient."""

    async def secret(self) -> str:
        return secret_of(await self._json(routes.webhook_secret()))

    async def rotate_secret(self) -> str:
        return secret_of(await self._json(routes.rotate_webhook_secret()))

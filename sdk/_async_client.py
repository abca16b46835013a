# Source of sdk/_client.py: edit this file, then run `python tests/tools/unasync.py`.
"""The asyncio client: drives the flows of _flows.py with httpx.AsyncClient and asyncio.sleep.

Everything but the I/O lives in _base.py, _routes.py, _flows.py and _sse.py; keep it so. The
`client.<noun>` resources live in a module each (_async_jobs.py, _async_deployments.py, ...).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar, cast, overload

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._async_batches import AsyncBatches
from sdk._async_billing import AsyncBilling
from sdk._async_deployments import AsyncDeployments, AsyncWorkers
from sdk._async_files import AsyncFiles
from sdk._async_jobs import AsyncJob, AsyncJobs, AsyncStream
from sdk._async_keys import AsyncKeys
from sdk._async_logs import AsyncLogs
from sdk._async_usage import AsyncUsage
from sdk._async_webhooks import AsyncWebhooks
from sdk._base import RetryPolicy, Runtime, sync_wait_s
from sdk._config import resolve_credentials
from sdk._flows import Flow, Send, Sleep
from sdk._sse import RunStatus, settle

T = TypeVar("T")


class AsyncClient:
    """The asyncio client for the platform's REST API.

    Example:
        from sdk import AsyncClient

        client = AsyncClient()  # URL/key from env or `platform login`
        print(await client.run("demo", {"prompt": "Hi", "max_tokens": 16}))
        async for delta in await client.run("demo", {"prompt": "Hi"}, stream=True):
            print(delta, end="", flush=True)
        job = await client.submit("demo", {"prompt": "Hi"}, webhook="https://example.com/hook")
        await job.wait(timeout=60)

    A request that fails to reach the platform, or gets 429/502/503/504, is sent again up to
    `max_retries` times with backoff; while the platform is down or restarting (no connection,
    502/503/504) a request that is safe to resend goes on being retried until it has failed
    for `max_unavailable_s`, with the same Idempotency-Key (docs/sdk.md, "Retries").

    `transport` is any httpx transport (tests pass `httpx.MockTransport`, or an ASGI one to
    talk to the app in process); `sleep`, `clock` and `rand` replace asyncio.sleep,
    time.monotonic and random.random (retry jitter) for tests.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 30.0,
        max_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        max_unavailable_s: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if max_unavailable_s < 0:
            raise ValueError("max_unavailable_s must be >= 0")
        self._rt = Runtime(
            credentials=resolve_credentials(base_url, api_key),
            timeout_s=timeout,
            policy=RetryPolicy(max_retries=max_retries, max_unavailable_s=max_unavailable_s),
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
        self.files = AsyncFiles(self)
        self.usage = AsyncUsage(self)
        self.logs = AsyncLogs(self)

    @property
    def base_url(self) -> str:
        return self._rt.credentials.base_url

    # --- runs and jobs ---

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
        on_status: Callable[[RunStatus], None] | None = ...,
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
        on_status: Callable[[RunStatus], None] | None = ...,
    ) -> str | AsyncStream | AsyncJob: ...

    async def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: bool = False,
        wait: bool = True,
        timeout: float | None = None,
        on_status: Callable[[RunStatus], None] | None = None,
    ) -> str | AsyncStream | AsyncJob:
        """Run `deployment` on `input` (a JobInput; a str is the prompt) and return its text.

        On a 202 the job is polled until it ends; `timeout` (seconds, None: no limit) bounds
        the whole wait and raises JobTimeout (for a stream: the wait after it broke off; a
        live stream is bounded by the HTTP read timeout between events). `stream=True`
        returns the text deltas (`AsyncStream`); `on_status` then hears each status the stream
        reports before the text (`RunStatus`: queued, starting with the cold start's phase,
        weight bytes and ETA, running);
        `wait=False` returns the job (`AsyncJob`) as the platform first answered it. A job
        that fails raises JobFailed (ModelError when the model or input is at fault).
        """
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
            return AsyncStream(self, response, timeout, started_s, on_status)
        raw = await self._execute(
            flows.run(self._rt, call, wait=wait, timeout_s=timeout, started_s=started_s)
        )
        job = AsyncJob(raw, self)
        if not wait:
            return job
        settle(job, "")
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
        """Queue an async job and return it at once (202).

        The `Idempotency-Key` (given, else a fresh uuid4) is sent with every retry of this
        call, so a submit re-sent after a dropped connection never creates a second job.
        """
        call = routes.submit(
            deployment,
            input,
            webhook=webhook,
            webhook_events=webhook_events,
            ttl_s=ttl_s,
            idempotency_key=idempotency_key or routes.new_idempotency_key(),
        )
        return AsyncJob(await self._execute(flows.request_job(self._rt, call)), self)

    # --- plumbing ---

    async def _execute(self, flow: Flow[T]) -> T:
        """Drive a flow to its result: send what it asks for, sleep when it says so."""
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

# Source of sdk/_client.py: edit this file, then run `python tests/tools/unasync.py`.
"""The asyncio client: drives the flows of _flows.py with httpx.AsyncClient and asyncio.sleep.

Everything but the I/O lives in _base.py, _routes.py, _flows.py and _sse.py; keep it so.
"""

from __future__ import annotations

import asyncio
import builtins
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, cast, overload

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._async_batches import AsyncBatches
from sdk._async_files import AsyncFiles
from sdk._async_keys import AsyncKeys
from sdk._async_resource import AsyncResource, AsyncResponseIterator
from sdk._async_usage import AsyncUsage
from sdk._base import Call, RetryPolicy, Runtime, job_id_header, secret_of, sync_wait_s
from sdk._config import resolve_credentials
from sdk._errors import APIConnectionError
from sdk._flows import Flow, Send, Sleep
from sdk._models import Deployment, JobView
from sdk._sse import RunStatus, StreamState, settle

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


class AsyncJob(JobView):
    """One job (a run or a submit), as last fetched; see JobView for the fields.

    Example:
        job = await client.submit("demo", {"prompt": "Hi"})
        await job.wait(timeout=60)  # JobFailed if it failed
        print(job.status, job.output["text"], job.usage)
    """

    __slots__ = ("_client",)

    def __init__(self, raw: dict[str, Any], client: AsyncClient) -> None:
        super().__init__(raw)
        self._client = client

    async def refresh(self) -> AsyncJob:
        """Fetch the job again; returns self, updated."""
        self._raw = await self._client._execute(
            flows.request_job(self._client._rt, routes.get_job(self.id))
        )
        return self

    async def wait(
        self, timeout: float | None = None, on_update: Callable[[AsyncJob], None] | None = None
    ) -> AsyncJob:
        """Poll until the job ends; JobFailed unless it succeeded, JobTimeout after `timeout`.

        `on_update` is called with the job at every poll (status, status_reason, ...).
        """
        hook = None if on_update is None else lambda raw: on_update(AsyncJob(raw, self._client))
        self._raw = await self._client._execute(
            flows.wait_for_job(self._client._rt, self._raw, timeout, hook)
        )
        settle(self, "", recovered=False)
        return self

    async def cancel(self) -> AsyncJob:
        """Ask the platform to cancel the job; returns self with the answer's state."""
        self._raw = await self._client._execute(
            flows.request_job(self._client._rt, routes.cancel_job(self.id))
        )
        return self


class AsyncStream(AsyncResponseIterator[str]):
    """The text deltas of a streamed run, as they arrive; `job_id` is known from the start.

    Example:
        async with await client.run("demo", {"prompt": "Hi"}, stream=True) as stream:
            async for delta in stream:
                print(delta, end="", flush=True)
        print(stream.job.usage)

    If the connection breaks off mid-stream the job is polled to its end and the text not yet
    streamed is yielded as one last delta, so the deltas always add up to the job's output.
    """

    def __init__(
        self,
        client: AsyncClient,
        response: httpx.Response,
        timeout_s: float | None,
        started_s: float,
        on_status: Callable[[RunStatus], None] | None = None,
    ) -> None:
        self._client = client
        self._response = response
        self._timeout_s = timeout_s
        self._started_s = started_s
        self._state = StreamState(job_id_header(response), on_status)
        self._job: AsyncJob | None = None
        self._items = self._generate()

    @property
    def job_id(self) -> str | None:
        return self._state.job_id

    @property
    def job(self) -> AsyncJob | None:
        """The final job, once the stream has ended."""
        return self._job

    @property
    def status(self) -> RunStatus | None:
        """The latest status the stream reported (None before the first)."""
        return self._state.status

    async def _generate(self) -> AsyncGenerator[str, None]:
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
                raise APIConnectionError(f"the run stream broke off: {e}") from e
        finally:
            await self._response.aclose()
        recovered = state.final is None
        if state.final is not None:
            self._job = AsyncJob(state.final, self._client)
        elif state.job_id is None:
            raise APIConnectionError("the run stream ended before naming its job")
        else:
            remaining_s = None
            if self._timeout_s is not None:
                remaining_s = self._timeout_s - (self._client._rt.clock() - self._started_s)
            raw = await self._client._execute(
                flows.recover_stream(self._client._rt, state.job_id, remaining_s)
            )
            self._job = AsyncJob(raw, self._client)
        rest = settle(self._job, state.seen_text, recovered=recovered)
        if rest:
            yield rest


# --- resources ---


class _AsyncResource(AsyncResource):
    async def _job(self, call: Call) -> AsyncJob:
        return AsyncJob(await self._run(flows.request_job(self._client._rt, call)), self._client)


class AsyncJobs(_AsyncResource):
    """`client.jobs`: read, list and cancel jobs."""

    async def get(self, job_id: str) -> AsyncJob:
        return await self._job(routes.get_job(job_id))

    async def list(
        self, deployment: str | None = None, status: str | None = None, limit: int | None = None
    ) -> builtins.list[AsyncJob]:
        """Jobs, newest first, optionally of one deployment / in one status; at most `limit`."""
        raws = await self._list(routes.list_jobs(deployment, status), limit)
        return [AsyncJob(raw, self._client) for raw in raws]

    async def cancel(self, job_id: str) -> AsyncJob:
        """Ask the platform to cancel a job; returns the job as the platform answered."""
        return await self._job(routes.cancel_job(job_id))


class AsyncDeployments(_AsyncResource):
    """`client.deployments`: create, update, read and delete deployments."""

    async def create(
        self, spec: Mapping[str, Any] | None = None, *, dry_run: bool = False, **fields: Any
    ) -> Deployment:
        """Create from a DeploymentSpec (a dict, keyword fields, or both; fields win).
        `dry_run`: run every check the server makes (the model included) and return what
        would be created, creating nothing.

        Example: await client.deployments.create(name="demo", model="store://models/demo/")
        """
        call = routes.create_deployment({**(spec or {}), **fields}, dry_run)
        return Deployment(await self._json(call))

    async def update(
        self,
        name: str,
        spec: Mapping[str, Any] | None = None,
        *,
        dry_run: bool = False,
        **fields: Any,
    ) -> Deployment:
        """Replace the spec of `name` (PUT); the version goes up when something changed.
        `dry_run`: check it and return what it would become, changing nothing."""
        call = routes.update_deployment(name, {**(spec or {}), **fields}, dry_run)
        return Deployment(await self._json(call))

    async def get(self, name: str) -> Deployment:
        return Deployment(await self._json(routes.get_deployment(name)))

    async def list(self) -> builtins.list[Deployment]:
        return [Deployment(raw) for raw in await self._list(routes.list_deployments(), None)]

    async def delete(self, name: str) -> None:
        """Delete `name`; its workers drain and stop."""
        await self._json(routes.delete_deployment(name))

    async def wait_ready(
        self,
        name: str,
        version: int | None = None,
        timeout: float | None = 600.0,
        on_update: Callable[[builtins.list[dict[str, Any]]], None] | None = None,
    ) -> dict[str, Any]:
        """Wait until a worker of `version` (None: the current one) is idle or busy; return it.

        Raises DeploymentNotReady when one of its workers fails or `timeout` passes.
        `on_update` sees that version's workers at every poll. NOTE: with min_workers 0 no
        worker starts until a call arrives, so this waits for one.
        """
        flow = flows.wait_ready(self._client._rt, name, version, timeout, on_update)
        return await self._run(flow)


class AsyncBilling(_AsyncResource):
    """`client.billing`: per-second billing records of workers."""

    async def records(
        self,
        deployment: str | None = None,
        worker_id: str | None = None,
        phase: str | None = None,
        limit: int | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> list[dict[str, Any]]:
        """BillingRecords; `seconds`, `rate_per_s` and `amount` are decimal strings."""
        call = routes.billing_records(deployment, worker_id, phase, since, until)
        return await self._list(call, limit)

    async def check(self) -> dict[str, Any]:
        """Drift between billing records, workers and jobs: `{"ok": bool, "issues": [...]}`."""
        result: dict[str, Any] = await self._json(routes.billing_check())
        return result


class AsyncWorkers(_AsyncResource):
    """`client.workers`: live and recently stopped workers."""

    async def list(self, deployment: str | None = None) -> builtins.list[dict[str, Any]]:
        return await self._list(routes.list_workers(deployment), None)


class AsyncWebhooks(_AsyncResource):
    """`client.webhooks`: the secret that signs this tenant's webhooks."""

    async def secret(self) -> str:
        """The `whsec_...` secret to pass to `sdk.webhooks.verify`."""
        return secret_of(await self._json(routes.webhook_secret()))

    async def rotate_secret(self) -> str:
        """A new signing secret, returned; the old one keeps signing too for the platform's
        rotation overlap (24 h by default), so receivers can switch without losing events."""
        return secret_of(await self._json(routes.rotate_webhook_secret()))

"""The blocking client: drives the flows of _flows.py with httpx.Client and time.sleep."""

from __future__ import annotations

import builtins
import random
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, cast, overload

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._base import Call, RetryPolicy, Runtime, job_id_header, secret_of, sync_wait_s
from sdk._batches import Batches
from sdk._config import resolve_credentials
from sdk._errors import PlatformConnectionError
from sdk._flows import Flow, Send, Sleep
from sdk._keys import Keys
from sdk._models import Deployment, JobView
from sdk._resource import SyncResource
from sdk._sse import StreamState, settle
from sdk._usage import Usage

T = TypeVar("T")


class Client:
    """Blocking client for the platform's REST API.

    Example:
        from sdk import Client

        client = Client()                                  # URL/key from env or `platform login`
        print(client.run("demo", {"prompt": "Hi", "max_tokens": 16}))
        for delta in client.run("demo", {"prompt": "Hi"}, stream=True):
            print(delta, end="", flush=True)
        job = client.submit("demo", {"prompt": "Hi"}, webhook="https://example.com/hook")
        job.wait(timeout=60)

    `transport` is any httpx transport (tests pass `httpx.MockTransport`, or an ASGI one to
    talk to the app in process); `sleep`, `clock` and `rand` replace time.sleep,
    time.monotonic and random.random (retry jitter) for tests.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 30.0,
        max_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
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
        self._http = httpx.Client(transport=transport, timeout=timeout)
        self.jobs = Jobs(self)
        self.deployments = Deployments(self)
        self.billing = Billing(self)
        self.workers = Workers(self)
        self.webhooks = Webhooks(self)
        self.batches = Batches(self)
        self.keys = Keys(self)
        self.usage = Usage(self)

    @property
    def base_url(self) -> str:
        return self._rt.credentials.base_url

    # --- runs and jobs ---

    @overload
    def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: Literal[False] = ...,
        wait: Literal[True] = ...,
        timeout: float | None = ...,
    ) -> str: ...
    @overload
    def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: Literal[True],
        wait: bool = ...,
        timeout: float | None = ...,
    ) -> Stream: ...
    @overload
    def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: Literal[False] = ...,
        wait: Literal[False],
        timeout: float | None = ...,
    ) -> Job: ...
    @overload
    def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: bool = ...,
        wait: bool = ...,
        timeout: float | None = ...,
    ) -> str | Stream | Job: ...

    def run(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        stream: bool = False,
        wait: bool = True,
        timeout: float | None = None,
    ) -> str | Stream | Job:
        """Run `deployment` on `input` (a JobInput; a str is the prompt) and return its text.

        On a 202 the job is polled until it ends; `timeout` (seconds, None: no limit) bounds
        the whole wait and raises JobTimeout (for a stream: the wait after it broke off; a
        live stream is bounded by the HTTP read timeout between events). `stream=True`
        returns a `Stream` of text deltas;
        `wait=False` returns the `Job` as the platform first answered it. A job that fails
        raises JobFailed (ModelError when the model or input is at fault).
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
            response = self._execute(flows.send(self._rt, call))
            return Stream(self, response, timeout, started_s)
        raw = self._execute(
            flows.run(self._rt, call, wait=wait, timeout_s=timeout, started_s=started_s)
        )
        job = Job(raw, self)
        if not wait:
            return job
        settle(job, "", recovered=False)
        return job.text or ""

    def submit(
        self,
        deployment: str,
        input: Mapping[str, Any] | str,
        *,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
        idempotency_key: str | None = None,
        ttl_s: float | None = None,
    ) -> Job:
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
        return Job(self._execute(flows.request_job(self._rt, call)), self)

    # --- plumbing ---

    def _execute(self, flow: Flow[T]) -> T:
        """Drive a flow to its result with blocking I/O."""
        outcome: flows.Outcome = None
        while True:
            try:
                action = flow.send(outcome)
            except StopIteration as stop:
                return cast(T, stop.value)
            if isinstance(action, Sleep):
                self._sleep(action.seconds)
                outcome = None
            else:
                outcome = self._send(action)

    def _send(self, action: Send) -> httpx.Response | httpx.TransportError:
        try:
            response = self._http.send(action.request, stream=action.stream)
            if action.stream and response.is_error:
                response.read()  # the error body is parsed into the exception
        except httpx.TransportError as e:
            return e
        return response

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Job(JobView):
    """One job (a run or a submit), as last fetched; see JobView for the fields.

    Example:
        job = client.submit("demo", {"prompt": "Hi"})
        job.wait(timeout=60)                  # JobFailed if it failed
        print(job.status, job.output["text"], job.usage)
    """

    __slots__ = ("_client",)

    def __init__(self, raw: dict[str, Any], client: Client) -> None:
        super().__init__(raw)
        self._client = client

    def refresh(self) -> Job:
        """Fetch the job again; returns self, updated."""
        self._raw = self._client._execute(
            flows.request_job(self._client._rt, routes.get_job(self.id))
        )
        return self

    def wait(
        self, timeout: float | None = None, on_update: Callable[[Job], None] | None = None
    ) -> Job:
        """Poll until the job ends; JobFailed unless it succeeded, JobTimeout after `timeout`.

        `on_update` is called with the job at every poll (status, status_reason, ...).
        """
        hook = None if on_update is None else lambda raw: on_update(Job(raw, self._client))
        self._raw = self._client._execute(
            flows.wait_for_job(self._client._rt, self._raw, timeout, hook)
        )
        settle(self, "", recovered=False)
        return self

    def cancel(self) -> Job:
        """Ask the platform to cancel the job; returns self with the answer's state."""
        self._raw = self._client._execute(
            flows.request_job(self._client._rt, routes.cancel_job(self.id))
        )
        return self


class Stream:
    """The text deltas of a streamed run, as they arrive; `job_id` is known from the start.

    Example:
        with client.run("demo", {"prompt": "Hi"}, stream=True) as stream:
            for delta in stream:
                print(delta, end="", flush=True)
        print(stream.job.usage)

    If the connection breaks off mid-stream the job is polled to its end and the text not yet
    streamed is yielded as one last delta, so the deltas always add up to the job's output.
    """

    def __init__(
        self, client: Client, response: httpx.Response, timeout_s: float | None, started_s: float
    ) -> None:
        self._client = client
        self._response = response
        self._timeout_s = timeout_s
        self._started_s = started_s
        self._state = StreamState(job_id_header(response))
        self._job: Job | None = None
        self._deltas = self._generate()

    @property
    def job_id(self) -> str | None:
        return self._state.job_id

    @property
    def job(self) -> Job | None:
        """The final job, once the stream has ended."""
        return self._job

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def close(self) -> None:
        self._deltas.close()
        self._response.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _generate(self) -> Generator[str, None, None]:
        state = self._state
        try:
            for line in self._response.iter_lines():
                delta = state.feed_line(line)
                if delta is not None:
                    yield delta
                if state.done:
                    break
        except httpx.TransportError as e:
            if state.job_id is None:
                raise PlatformConnectionError(f"the run stream broke off: {e}") from e
        finally:
            self._response.close()
        recovered = state.final is None
        if state.final is not None:
            self._job = Job(state.final, self._client)
        elif state.job_id is None:
            raise PlatformConnectionError("the run stream ended before naming its job")
        else:
            remaining_s = None
            if self._timeout_s is not None:
                remaining_s = self._timeout_s - (self._client._rt.clock() - self._started_s)
            raw = self._client._execute(
                flows.recover_stream(self._client._rt, state.job_id, remaining_s)
            )
            self._job = Job(raw, self._client)
        rest = settle(self._job, state.seen_text, recovered=recovered)
        if rest:
            yield rest


# --- resources ---


class _Resource(SyncResource):
    def _job(self, call: Call) -> Job:
        return Job(self._run(flows.request_job(self._client._rt, call)), self._client)


class Jobs(_Resource):
    """`client.jobs`: read, list and cancel jobs."""

    def get(self, job_id: str) -> Job:
        return self._job(routes.get_job(job_id))

    def list(
        self, deployment: str | None = None, status: str | None = None, limit: int | None = None
    ) -> builtins.list[Job]:
        """Jobs, newest first, optionally of one deployment / in one status; at most `limit`."""
        raws = self._list(routes.list_jobs(deployment, status), limit)
        return [Job(raw, self._client) for raw in raws]

    def cancel(self, job_id: str) -> Job:
        """Ask the platform to cancel a job; returns the job as the platform answered."""
        return self._job(routes.cancel_job(job_id))


class Deployments(_Resource):
    """`client.deployments`: create, update, read and delete deployments."""

    def create(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> Deployment:
        """Create from a DeploymentSpec (a dict, keyword fields, or both; fields win).

        Example: client.deployments.create(name="demo", model="s3://models/demo/")
        """
        return Deployment(self._json(routes.create_deployment({**(spec or {}), **fields})))

    def update(self, name: str, spec: Mapping[str, Any] | None = None, **fields: Any) -> Deployment:
        """Replace the spec of `name` (PUT); the version goes up when something changed."""
        return Deployment(self._json(routes.update_deployment(name, {**(spec or {}), **fields})))

    def get(self, name: str) -> Deployment:
        return Deployment(self._json(routes.get_deployment(name)))

    def list(self) -> builtins.list[Deployment]:
        return [Deployment(raw) for raw in self._list(routes.list_deployments(), None)]

    def delete(self, name: str) -> None:
        """Delete `name`; its workers drain and stop."""
        self._json(routes.delete_deployment(name))

    def wait_ready(
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
        return self._run(flows.wait_ready(self._client._rt, name, version, timeout, on_update))


class Billing(_Resource):
    """`client.billing`: per-second billing records of workers."""

    def records(
        self,
        deployment: str | None = None,
        worker_id: str | None = None,
        phase: str | None = None,
        limit: int | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> list[dict[str, Any]]:
        """BillingRecords; `seconds`, `rate_per_s` and `amount` are decimal strings."""
        return self._list(routes.billing_records(deployment, worker_id, phase, since, until), limit)

    def check(self) -> dict[str, Any]:
        """Drift between billing records, workers and jobs: `{"ok": bool, "issues": [...]}`."""
        result: dict[str, Any] = self._json(routes.billing_check())
        return result


class Workers(_Resource):
    """`client.workers`: live and recently stopped workers."""

    def list(self, deployment: str | None = None) -> builtins.list[dict[str, Any]]:
        return self._list(routes.list_workers(deployment), None)


class Webhooks(_Resource):
    """`client.webhooks`: the secret that signs this tenant's webhooks."""

    def secret(self) -> str:
        """The `whsec_...` secret to pass to `sdk.webhooks.verify`."""
        return secret_of(self._json(routes.webhook_secret()))

    def rotate_secret(self) -> str:
        """A new signing secret, returned; the old one keeps signing too for the platform's
        rotation overlap (24 h by default), so receivers can switch without losing events."""
        return secret_of(self._json(routes.rotate_webhook_secret()))

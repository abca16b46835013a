# Source of sdk/_jobs.py: edit this file, then run `python tests/tools/unasync.py`.
"""Jobs: one job as last fetched (`AsyncJob`), the text deltas of a streamed run
(`AsyncStream`), and `client.jobs`.

job = await client.submit("demo", {"prompt": "Hi"})
await job.wait(timeout=60)  # JobFailed if it failed
print((await client.jobs.get(job.id)).status)
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._async_resource import AsyncResource, AsyncResponseIterator
from sdk._base import Call, job_id_header
from sdk._errors import APIConnectionError
from sdk._models import JobView
from sdk._sse import RunStatus, StreamState, settle

if TYPE_CHECKING:
    from sdk._async_client import AsyncClient


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
        settle(self, "")
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

    The deltas always add up to the job's output. If the connection breaks off mid-stream,
    the job is polled to its end and the text not yet streamed is yielded as one last delta.
    If the job was run again (its worker lost) and its new text departs from what was already
    yielded (the server's `restarted` event), no more deltas come: the stream is read to its
    end and raises StreamRestarted, whose `.job.text` is the output. `text` is the job's text
    as the stream has it so far (the new attempt's after a restart; the output at the end).
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
    def text(self) -> str:
        """The job's text so far; once the stream ended with its job, the job's output."""
        if self._job is not None and self._job.status == "succeeded":
            return self._job.text or ""
        return self._state.text

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
        rest = settle(self._job, state.seen_text, restarted=state.restarted)
        if rest:
            yield rest


class AsyncJobs(AsyncResource):
    """`client.jobs`: read, list and cancel jobs."""

    async def _job(self, call: Call) -> AsyncJob:
        return AsyncJob(await self._run(flows.request_job(self._client._rt, call)), self._client)

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

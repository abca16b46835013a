# Source of sdk/_batches.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.batches`: one job per input line, run a few at a time, results as JSONL.

batch = await client.batches.create([{"prompt": "a"}, {"prompt": "b"}], deployment="demo")
await batch.wait(timeout=600)
async for line in await batch.results():  # {"index": 0, "job_id": ..., "status": ...}
    print(line["index"], line["status"], (line["output"] or {}).get("text"))
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._async_resource import AsyncResource, AsyncResponseIterator
from sdk._base import BATCH_STATUS_HEADER, parse_jsonl_line
from sdk._errors import APIConnectionError
from sdk._models import BatchView
from sdk._routes import BatchSource

if TYPE_CHECKING:
    from sdk._async_client import AsyncClient


class AsyncBatch(BatchView):
    """One batch, as last fetched; see BatchView for the fields.

    Example:
        batch = await client.batches.create("prompts.jsonl", deployment="demo")
        await batch.wait(timeout=600, on_update=lambda b: print(b.finished, "/", b.total))
        async for line in await batch.results():
            print(line["index"], line["status"])
    """

    __slots__ = ("_client",)

    def __init__(self, raw: dict[str, Any], client: AsyncClient) -> None:
        super().__init__(raw)
        self._client = client

    async def refresh(self) -> AsyncBatch:
        """Fetch the batch again; returns self, updated."""
        self._raw = await self._client.batches._object(routes.get_batch(self.id))
        return self

    async def wait(
        self, timeout: float | None = None, on_update: Callable[[AsyncBatch], None] | None = None
    ) -> AsyncBatch:
        """Poll until the batch is completed or canceled (BatchTimeout after `timeout`).

        A batch whose jobs failed still completes: read each line's `status` in `results()`.
        """
        hook = None if on_update is None else lambda raw: on_update(AsyncBatch(raw, self._client))
        self._raw = await self._client._execute(
            flows.wait_for_batch(self._client._rt, self._raw, timeout, hook)
        )
        return self

    async def cancel(self) -> AsyncBatch:
        """End every unfinished job of the batch; returns self, canceled."""
        self._raw = await self._client.batches._object(routes.cancel_batch(self.id))
        return self

    async def results(self) -> AsyncBatchResults:
        """The result lines so far (all of them once completed); see `batches.results`."""
        return await self._client.batches.results(self.id)


class AsyncBatchResults(AsyncResponseIterator[dict[str, Any]]):
    """The result lines of a batch, read as they arrive: one dict per finished job.

    `status` is the batch's status when the platform answered: before `completed`, only the
    jobs finished so far have a line.

    Example:
        async with await client.batches.results("bat_1") as results:
            async for line in results:
                print(line["index"], line["job_id"], line["status"])
    """

    def __init__(self, response: httpx.Response, batch_id: str) -> None:
        self._response = response
        self.batch_id = batch_id
        self.status: str | None = response.headers.get(BATCH_STATUS_HEADER)
        self._items = self._generate()

    async def _generate(self) -> AsyncGenerator[dict[str, Any], None]:
        what = f"results of batch {self.batch_id}"
        try:
            async for line in self._response.aiter_lines():
                item = parse_jsonl_line(line, what)
                if item is not None:
                    yield item
        except httpx.TransportError as e:
            raise APIConnectionError(f"the {what} broke off: {e}") from e
        finally:
            await self._response.aclose()


class AsyncBatches(AsyncResource):
    """`client.batches`: create, read, list, wait for and cancel batches; stream results."""

    async def create(
        self,
        inputs: BatchSource,
        *,
        deployment: str,
        webhook: str | None = None,
        max_in_flight: int | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncBatch:
        """Create a batch from a list of inputs, a local .jsonl file, or a store:// (or s3://)
        JSONL object.

        Every line is validated before anything is created (a bad one raises
        InvalidRequestError naming its line). With a `webhook`, `batch.completed` is sent
        there when every job finished. The `Idempotency-Key` (given, else a fresh uuid4) is
        sent with every retry, so a create re-sent after a dropped connection makes one batch.

        Example:
            await client.batches.create([{"prompt": "a"}, "b"], deployment="demo")
            await client.batches.create("in.jsonl", deployment="demo", webhook="https://...")
        """
        call = routes.create_batch(
            deployment,
            inputs,
            webhook=webhook,
            max_in_flight=max_in_flight,
            idempotency_key=idempotency_key or routes.new_idempotency_key(),
        )
        return AsyncBatch(await self._object(call), self._client)

    async def get(self, batch_id: str) -> AsyncBatch:
        return AsyncBatch(await self._object(routes.get_batch(batch_id)), self._client)

    async def list(
        self, deployment: str | None = None, status: str | None = None, limit: int | None = None
    ) -> builtins.list[AsyncBatch]:
        """Batches, newest first, optionally of one deployment / in one status."""
        raws = await self._list(routes.list_batches(deployment, status), limit)
        return [AsyncBatch(raw, self._client) for raw in raws]

    async def cancel(self, batch_id: str) -> AsyncBatch:
        """Cancel a batch's unfinished jobs (ConflictError if it already completed)."""
        return AsyncBatch(await self._object(routes.cancel_batch(batch_id)), self._client)

    async def wait(
        self,
        batch_id: str,
        timeout: float | None = None,
        on_update: Callable[[AsyncBatch], None] | None = None,
    ) -> AsyncBatch:
        """Poll a batch until it is completed or canceled; BatchTimeout after `timeout`."""
        batch = await self.get(batch_id)
        return await batch.wait(timeout, on_update)

    async def results(self, batch_id: str) -> AsyncBatchResults:
        """Stream the result lines (JSONL) of a batch, in input order.

        Read it inside `async with` (or to the end) so the connection is released.
        """
        call = routes.batch_results(batch_id)
        response = await self._run(flows.send(self._client._rt, call))
        return AsyncBatchResults(response, batch_id)

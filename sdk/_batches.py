"""`client.batches`: one job per input line, run a few at a time, results as JSONL.

    batch = client.batches.create([{"prompt": "a"}, {"prompt": "b"}], deployment="demo")
    batch.wait(timeout=600)
    for line in batch.results():            # {"index": 0, "job_id": ..., "status": ..., ...}
        print(line["index"], line["status"], (line["output"] or {}).get("text"))

The sync classes come first, their async twins after; both use the same routes and flows.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._base import Call, parse_jsonl_line
from sdk._errors import PlatformConnectionError
from sdk._models import BatchView
from sdk._resource import AsyncResource, SyncResource
from sdk._routes import BatchSource

if TYPE_CHECKING:
    from sdk._async_client import AsyncClient
    from sdk._client import Client

BATCH_STATUS_HEADER = "X-Batch-Status"


def _create_call(
    source: BatchSource,
    deployment: str,
    webhook: str | None,
    max_in_flight: int | None,
    idempotency_key: str | None,
) -> Call:
    # NOTE: always keyed, so a create re-sent after a dropped connection makes one batch.
    return routes.create_batch(
        deployment,
        source,
        webhook=webhook,
        max_in_flight=max_in_flight,
        idempotency_key=idempotency_key or routes.new_idempotency_key(),
    )


# --- sync -----------------------------------------------------------------------------------


class Batch(BatchView):
    """One batch, as last fetched; see BatchView for the fields.

    Example:
        batch = client.batches.create("prompts.jsonl", deployment="demo")
        batch.wait(timeout=600, on_update=lambda b: print(b.finished, "/", b.total))
        for line in batch.results():
            print(line["index"], line["status"])
    """

    __slots__ = ("_client",)

    def __init__(self, raw: dict[str, Any], client: Client) -> None:
        super().__init__(raw)
        self._client = client

    def refresh(self) -> Batch:
        """Fetch the batch again; returns self, updated."""
        self._raw = self._client.batches._object(routes.get_batch(self.id))
        return self

    def wait(
        self, timeout: float | None = None, on_update: Callable[[Batch], None] | None = None
    ) -> Batch:
        """Poll until the batch is completed or canceled (BatchTimeout after `timeout`).

        A batch whose jobs failed still completes: read each line's `status` in `results()`.
        """
        hook = None if on_update is None else lambda raw: on_update(Batch(raw, self._client))
        self._raw = self._client._execute(
            flows.wait_for_batch(self._client._rt, self._raw, timeout, hook)
        )
        return self

    def cancel(self) -> Batch:
        """End every unfinished job of the batch; returns self, canceled."""
        self._raw = self._client.batches._object(routes.cancel_batch(self.id))
        return self

    def results(self) -> BatchResults:
        """The result lines so far (all of them once completed); see `Batches.results`."""
        return self._client.batches.results(self.id)


class BatchResults:
    """The result lines of a batch, read as they arrive: one dict per finished job.

    `status` is the batch's status when the platform answered: before `completed`, only the
    jobs finished so far have a line.

    Example:
        with client.batches.results("bat_1") as results:
            for line in results:
                print(line["index"], line["job_id"], line["status"])
    """

    def __init__(self, response: httpx.Response, batch_id: str) -> None:
        self._response = response
        self.batch_id = batch_id
        self.status: str | None = response.headers.get(BATCH_STATUS_HEADER)
        self._lines = self._generate()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._lines)

    def close(self) -> None:
        self._lines.close()
        self._response.close()

    def __enter__(self) -> BatchResults:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _generate(self) -> Generator[dict[str, Any], None, None]:
        what = f"results of batch {self.batch_id}"
        try:
            for line in self._response.iter_lines():
                item = parse_jsonl_line(line, what)
                if item is not None:
                    yield item
        except httpx.TransportError as e:
            raise PlatformConnectionError(f"the {what} broke off: {e}") from e
        finally:
            self._response.close()


class Batches(SyncResource):
    """`client.batches`: create, read, list, wait for and cancel batches; stream results."""

    def create(
        self,
        inputs: BatchSource,
        *,
        deployment: str,
        webhook: str | None = None,
        max_in_flight: int | None = None,
        idempotency_key: str | None = None,
    ) -> Batch:
        """Create a batch from a list of inputs, a local .jsonl file, or an s3:// JSONL object.

        Every line is validated before anything is created (a bad one raises
        InvalidRequestError naming its line). With a `webhook`, `batch.completed` is sent
        there when every job finished.

        Example:
            client.batches.create([{"prompt": "a"}, "b"], deployment="demo", max_in_flight=2)
            client.batches.create("prompts.jsonl", deployment="demo", webhook="https://...")
        """
        call = _create_call(inputs, deployment, webhook, max_in_flight, idempotency_key)
        return Batch(self._object(call), self._client)

    def get(self, batch_id: str) -> Batch:
        return Batch(self._object(routes.get_batch(batch_id)), self._client)

    def list(
        self, deployment: str | None = None, status: str | None = None, limit: int | None = None
    ) -> builtins.list[Batch]:
        """Batches, newest first, optionally of one deployment / in one status."""
        raws = self._list(routes.list_batches(deployment, status), limit)
        return [Batch(raw, self._client) for raw in raws]

    def cancel(self, batch_id: str) -> Batch:
        """Cancel a batch's unfinished jobs (ConflictError if it already completed)."""
        return Batch(self._object(routes.cancel_batch(batch_id)), self._client)

    def wait(
        self,
        batch_id: str,
        timeout: float | None = None,
        on_update: Callable[[Batch], None] | None = None,
    ) -> Batch:
        """Poll a batch until it is completed or canceled; BatchTimeout after `timeout`."""
        return self.get(batch_id).wait(timeout, on_update)

    def results(self, batch_id: str) -> BatchResults:
        """Stream the result lines (JSONL) of a batch, in input order.

        Use it in a `with` block (or read it to the end) so the connection is released.
        """
        call = routes.batch_results(batch_id)
        response = self._run(flows.send(self._client._rt, call))
        return BatchResults(response, batch_id)


# --- async ----------------------------------------------------------------------------------


class AsyncBatch(BatchView):
    """`Batch` for `AsyncClient`: the same fields, with awaitable methods."""

    __slots__ = ("_client",)

    def __init__(self, raw: dict[str, Any], client: AsyncClient) -> None:
        super().__init__(raw)
        self._client = client

    async def refresh(self) -> AsyncBatch:
        self._raw = await self._client.batches._object(routes.get_batch(self.id))
        return self

    async def wait(
        self,
        timeout: float | None = None,
        on_update: Callable[[AsyncBatch], None] | None = None,
    ) -> AsyncBatch:
        hook = None if on_update is None else lambda raw: on_update(AsyncBatch(raw, self._client))
        self._raw = await self._client._execute(
            flows.wait_for_batch(self._client._rt, self._raw, timeout, hook)
        )
        return self

    async def cancel(self) -> AsyncBatch:
        self._raw = await self._client.batches._object(routes.cancel_batch(self.id))
        return self

    async def results(self) -> AsyncBatchResults:
        return await self._client.batches.results(self.id)


class AsyncBatchResults:
    """`BatchResults` for `AsyncClient`: `async for line in results`."""

    def __init__(self, response: httpx.Response, batch_id: str) -> None:
        self._response = response
        self.batch_id = batch_id
        self.status: str | None = response.headers.get(BATCH_STATUS_HEADER)
        self._lines = self._generate()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._lines.__anext__()

    async def aclose(self) -> None:
        await self._lines.aclose()
        await self._response.aclose()

    async def __aenter__(self) -> AsyncBatchResults:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _generate(self) -> AsyncGenerator[dict[str, Any], None]:
        # NOTE: mirrors BatchResults._generate; only the awaits differ.
        what = f"results of batch {self.batch_id}"
        try:
            async for line in self._response.aiter_lines():
                item = parse_jsonl_line(line, what)
                if item is not None:
                    yield item
        except httpx.TransportError as e:
            raise PlatformConnectionError(f"the {what} broke off: {e}") from e
        finally:
            await self._response.aclose()


class AsyncBatches(AsyncResource):
    """`client.batches` of AsyncClient."""

    async def create(
        self,
        inputs: BatchSource,
        *,
        deployment: str,
        webhook: str | None = None,
        max_in_flight: int | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncBatch:
        call = _create_call(inputs, deployment, webhook, max_in_flight, idempotency_key)
        return AsyncBatch(await self._object(call), self._client)

    async def get(self, batch_id: str) -> AsyncBatch:
        return AsyncBatch(await self._object(routes.get_batch(batch_id)), self._client)

    async def list(
        self, deployment: str | None = None, status: str | None = None, limit: int | None = None
    ) -> builtins.list[AsyncBatch]:
        raws = await self._list(routes.list_batches(deployment, status), limit)
        return [AsyncBatch(raw, self._client) for raw in raws]

    async def cancel(self, batch_id: str) -> AsyncBatch:
        return AsyncBatch(await self._object(routes.cancel_batch(batch_id)), self._client)

    async def wait(
        self,
        batch_id: str,
        timeout: float | None = None,
        on_update: Callable[[AsyncBatch], None] | None = None,
    ) -> AsyncBatch:
        return await (await self.get(batch_id)).wait(timeout, on_update)

    async def results(self, batch_id: str) -> AsyncBatchResults:
        response = await self._run(flows.send(self._client._rt, routes.batch_results(batch_id)))
        return AsyncBatchResults(response, batch_id)

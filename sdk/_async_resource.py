# Source of sdk/_resource.py: edit this file, then run `python tests/tools/unasync.py`.
"""Base class of the `client.<noun>` resources: a handle on the client that runs flows.

A resource builds its `Call`s with _routes.py and runs them through the flows of _flows.py,
so the client's `_execute` is its only I/O.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import httpx

from sdk import _flows as flows
from sdk._base import Call

if TYPE_CHECKING:
    from sdk._async_client import AsyncClient

T = TypeVar("T")


class AsyncResource:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def _run(self, flow: flows.Flow[T]) -> T:
        return await self._client._execute(flow)

    async def _json(self, call: Call) -> Any:
        return await self._run(flows.request_json(self._client._rt, call))

    async def _object(self, call: Call) -> dict[str, Any]:
        return await self._run(flows.request_object(self._client._rt, call))

    async def _list(self, call: Call, limit: int | None) -> builtins.list[dict[str, Any]]:
        return await self._run(flows.request_list(self._client._rt, call, limit))


class AsyncResponseIterator(Generic[T]):
    """Items parsed from a streamed answer, as they arrive; closing it (`aclose`, or leaving
    its `async with`) closes the answer. Subclasses set `_response` and `_items`."""

    _response: httpx.Response
    _items: AsyncGenerator[T, None]

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        return await self._items.__anext__()

    async def aclose(self) -> None:
        await self._items.aclose()
        await self._response.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

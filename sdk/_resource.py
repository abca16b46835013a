"""Base classes of the `client.<noun>` resources: a handle on the client that runs flows.

A resource module (`_batches.py`, `_keys.py`, `_usage.py`) holds the sync class and its async
twin side by side; both build the same `Call`s (_routes.py) and run the same flows
(_flows.py), so the only difference between them is `await`.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, TypeVar

from sdk import _flows as flows
from sdk._base import Call

if TYPE_CHECKING:
    from sdk._async_client import AsyncClient
    from sdk._client import Client

T = TypeVar("T")


class SyncResource:
    def __init__(self, client: Client) -> None:
        self._client = client

    def _run(self, flow: flows.Flow[T]) -> T:
        return self._client._execute(flow)

    def _json(self, call: Call) -> Any:
        return self._run(flows.request_json(self._client._rt, call))

    def _object(self, call: Call) -> dict[str, Any]:
        return self._run(flows.request_object(self._client._rt, call))

    def _list(self, call: Call, limit: int | None) -> builtins.list[dict[str, Any]]:
        return self._run(flows.request_list(self._client._rt, call, limit))


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

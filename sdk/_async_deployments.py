# Source of sdk/_deployments.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.deployments` (create, update, read, delete, wait until ready) and `client.workers`
(the workers that serve them).

await client.deployments.create(name="demo", model="store://models/demo/")
worker = await client.deployments.wait_ready("demo", timeout=600)
print([w["state"] for w in await client.workers.list("demo")])
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import Any

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._async_resource import AsyncResource
from sdk._models import Deployment


class AsyncDeployments(AsyncResource):
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


class AsyncWorkers(AsyncResource):
    """`client.workers`: live and recently stopped workers."""

    async def list(self, deployment: str | None = None) -> builtins.list[dict[str, Any]]:
        return await self._list(routes.list_workers(deployment), None)

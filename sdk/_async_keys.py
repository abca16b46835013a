# Source of sdk/_keys.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.keys`: this tenant's API keys (the caller's key needs the `admin` scope).

key = await client.keys.create(name="ci", scopes=["run", "read"])
print(key.key)  # the secret: shown once, stored hashed by the platform
await client.keys.revoke(key.id)  # refused from the next request on
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from sdk import _routes as routes
from sdk._async_resource import AsyncResource
from sdk._models import ApiKey


class AsyncKeys(AsyncResource):
    """`client.keys`: create, list and revoke API keys."""

    async def create(self, name: str = "", scopes: Sequence[str] | None = None) -> ApiKey:
        """A new key; its secret is `.key`, in this answer only. Never retried once sent."""
        return ApiKey(await self._object(routes.create_key(name, scopes)))

    async def list(self) -> builtins.list[ApiKey]:
        """Every key of the tenant, revoked ones included (never their secrets)."""
        return [ApiKey(raw) for raw in await self._list(routes.list_keys(), None)]

    async def revoke(self, key_id: str) -> None:
        """Revoke a key by its id; revoking twice is harmless."""
        await self._json(routes.revoke_key(key_id))
